"""The simulation's ClientApp: each message goes to the run's method's handler."""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from flwr_importance.tooling.testing.fault_injection import fault_injection_mod
from simulations.methods import QUERY_ACTIONS, load_method
from simulations.task import local_task

# The mod injects faults only when the run config's `fault-rate` is above 0.
app = ClientApp(mods=[fault_injection_mod])


def dispatch(message: Message, context: Context) -> Message:
    """Serve ``message`` with the handler of the run's ``strategy``."""
    strategy = str(context.run_config["strategy"])
    handlers = load_method(strategy).client_handlers(local_task)
    message_type = message.metadata.message_type
    if message_type not in handlers:
        raise ValueError(f"strategy '{strategy}' has no handler for '{message_type}'")
    return handlers[message_type](message, context)


app.train()(dispatch)
app.evaluate()(dispatch)
for action in QUERY_ACTIONS:
    app.query(action)(dispatch)
