"""Server optimizers: the new global model from the round's update estimate.

Every strategy of the library estimates the round's update ``Delta_t`` (its
unbiased or reweighted combination of the clients' updates) and, by default,
replaces the model with ``x_t + Delta_t``. A server optimizer instead treats
``Delta_t`` as a pseudo-gradient (Reddi et al., "Adaptive Federated
Optimization", ICLR 2021, Algorithm 2; FedAvgM: Hsu et al., 2019), so the
sampling and its estimator are kept and only the step changes. See
docs/methods.md, section "Server optimizers".

The steps are those of Flower 1.41's ``FedAdam``, ``FedYogi``, ``FedAdagrad``
and ``FedAvgM`` (``flwr.serverapp.strategy``), the reference they are tested
against, arrays keyed by name as in an ``ArrayRecord``:

* Adagrad, Yogi, Adam (Algorithm 2): ``m_t = beta_1 m_{t-1} + (1 - beta_1)
  Delta_t``; ``v_t = v_{t-1} + Delta_t^2`` (Adagrad), ``v_{t-1} - (1 - beta_2)
  Delta_t^2 sign(v_{t-1} - Delta_t^2)`` (Yogi) or ``beta_2 v_{t-1} + (1 -
  beta_2) Delta_t^2`` (Adam); ``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)``,
  with ``m_{-1} = v_{-1} = 0``. Adam's ``eta`` is bias-corrected as Flower
  does, ``eta sqrt(1 - beta_2^(t + 1)) / (1 - beta_1^(t + 1))`` at server
  round ``t``; Algorithm 2 has no bias correction.
* Momentum (FedAvgM): the pseudo-gradient ``g_t = -Delta_t``, ``u_t = beta
  u_{t-1} + g_t`` (``u_1 = g_1``; no momentum when ``beta = 0``) and ``x_{t+1}
  = x_t - lr u_t``.

Each optimizer is a frozen settings object; its moments live in an
:class:`OptimizerState` that :meth:`ServerOptimizer.step` returns anew, so the
functions stay pure and one optimizer can configure several strategies.
Arrays that are not floating point (a batch-norm counter) are not optimized:
they take the aggregated value, as under the default step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Real
from typing import cast

import numpy as np
from numpy.typing import NDArray

from flwr_importance.validation import check_positive

#: Named arrays, as the values of an ``ArrayRecord``.
Arrays = Mapping[str, NDArray[np.generic]]
FloatArray = NDArray[np.floating]


@dataclass(frozen=True)
class OptimizerState:
    """The moments a server optimizer carries from one round to the next.

    Attributes
    ----------
    first : dict of str to NDArray
        ``m_t`` (Adagrad, Yogi, Adam) or the momentum buffer ``u_t``
        (Momentum); empty before the first step.
    second : dict of str to NDArray
        ``v_t`` (Adagrad, Yogi, Adam); empty otherwise.
    """

    first: dict[str, NDArray[np.floating]] = field(default_factory=dict)
    second: dict[str, NDArray[np.floating]] = field(default_factory=dict)


def _check_fraction(name: str, value: float) -> float:
    """``value`` as a float in ``[0, 1)``; else a TypeError or ValueError."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{name} must lie in [0, 1), got {value!r}")
    return float(value)


def _optimized_keys(current: Arrays, aggregated: Arrays) -> list[str]:
    """The keys a step changes: floating-point arrays, checked to match."""
    if set(current) != set(aggregated):
        raise ValueError(
            "the aggregated arrays' names differ from the current model's: "
            f"{sorted(set(current) ^ set(aggregated))}"
        )
    for key, array in current.items():
        if np.shape(aggregated[key]) != np.shape(array):
            raise ValueError(
                f"array '{key}' has shape {np.shape(aggregated[key])}, "
                f"the current model's has {np.shape(array)}"
            )
    return [
        key
        for key, array in current.items()
        if np.issubdtype(np.asarray(array).dtype, np.floating)
    ]


@dataclass(frozen=True)
class ServerOptimizer(ABC):
    """A server optimizer's settings and its step (Reddi et al., Algorithm 2)."""

    #: The Flower strategy whose step this is, for logs and docs.
    flower_name: str = field(init=False, default="", repr=False)

    def step(
        self,
        current: Arrays,
        aggregated: Arrays,
        state: OptimizerState,
        server_round: int,
    ) -> tuple[dict[str, NDArray[np.generic]], OptimizerState]:
        """The new model and state after the round's default-step model ``aggregated``.

        Parameters
        ----------
        current : Arrays
            The model ``x_t`` the round started from.
        aggregated : Arrays
            The model the strategy's own step gives, ``x_t + Delta_t``;
            ``Delta_t = aggregated - current`` is the round's update estimate.
        state : OptimizerState
            The previous round's state (``OptimizerState()`` before the first).
        server_round : int
            The round (1, 2, ...): Adam's bias correction reads it.

        Returns
        -------
        tuple of (dict of str to NDArray, OptimizerState)
            The new model, every array in its original dtype, and the state.
        """
        keys = _optimized_keys(current, aggregated)
        # Only floating-point arrays are kept (_optimized_keys).
        floats = {key: cast(FloatArray, np.asarray(current[key])) for key in keys}
        delta: dict[str, FloatArray] = {
            key: cast(FloatArray, np.asarray(aggregated[key])) - floats[key]
            for key in keys
        }
        moved, new_state = self.move(floats, delta, state, server_round)
        new_model = {key: np.asarray(array) for key, array in aggregated.items()}
        for key in keys:
            dtype = np.asarray(current[key]).dtype
            new_model[key] = moved[key].astype(dtype, copy=False)
        return new_model, new_state

    @abstractmethod
    def move(
        self,
        current: dict[str, NDArray[np.floating]],
        delta: dict[str, NDArray[np.floating]],
        state: OptimizerState,
        server_round: int,
    ) -> tuple[dict[str, NDArray[np.floating]], OptimizerState]:
        """The optimized arrays from ``current`` and the update ``delta``."""

    @abstractmethod
    def settings(self) -> dict[str, float]:
        """The settings by name, for a strategy's summary."""

    def title(self) -> str:
        """The optimizer's name and the Flower strategy whose step it takes."""
        return f"{type(self).__name__} (Flower's {self.flower_name} step)"


def check_server_optimizer(value: object) -> ServerOptimizer | None:
    """``value``, once checked to be a :class:`ServerOptimizer` or None.

    Raises
    ------
    TypeError
        Anything else, e.g. Flower's ``FedAdam`` strategy in its place.
    """
    if value is not None and not isinstance(value, ServerOptimizer):
        raise TypeError(
            "server_optimizer must be a ServerOptimizer (ServerAdam, ServerYogi, "
            f"ServerAdagrad, ServerMomentum) or None, got {value!r}"
        )
    return value


@dataclass(frozen=True)
class AdaptiveOptimizer(ServerOptimizer):
    """Algorithm 2's shared part: the first moment and the adaptive step.

    Parameters
    ----------
    eta : float
        Server learning rate (> 0).
    beta_1 : float
        First-moment decay, in [0, 1).
    beta_2 : float
        Second-moment decay, in [0, 1) (unused by Adagrad).
    tau : float
        Degree of adaptivity, added to ``sqrt(v_t)`` (> 0).
    """

    eta: float = 0.1
    beta_1: float = 0.9
    beta_2: float = 0.99
    tau: float = 1e-3

    def __post_init__(self) -> None:
        """Check the settings."""
        check_positive("eta", self.eta)
        check_positive("tau", self.tau)
        _check_fraction("beta_1", self.beta_1)
        _check_fraction("beta_2", self.beta_2)

    def settings(self) -> dict[str, float]:
        """``eta``, ``beta_1``, ``beta_2`` and ``tau``."""
        return {
            "eta": self.eta,
            "beta_1": self.beta_1,
            "beta_2": self.beta_2,
            "tau": self.tau,
        }

    def move(
        self,
        current: dict[str, NDArray[np.floating]],
        delta: dict[str, NDArray[np.floating]],
        state: OptimizerState,
        server_round: int,
    ) -> tuple[dict[str, NDArray[np.floating]], OptimizerState]:
        """``x_t + eta_t m_t / (sqrt(v_t) + tau)`` (Algorithm 2's last line)."""
        first = {
            key: self.beta_1 * state.first.get(key, np.zeros_like(value))
            + (1 - self.beta_1) * value
            for key, value in delta.items()
        }
        second = {
            key: self.second_moment(
                state.second.get(key, np.zeros_like(value)), value**2
            )
            for key, value in delta.items()
        }
        eta = self.step_size(server_round)
        moved = {
            key: value + eta * first[key] / (np.sqrt(second[key]) + self.tau)
            for key, value in current.items()
        }
        return moved, OptimizerState(first, second)

    @abstractmethod
    def second_moment(
        self, previous: NDArray[np.floating], squared: NDArray[np.floating]
    ) -> NDArray[np.floating]:
        """``v_t`` from ``v_{t-1}`` and ``Delta_t^2``."""

    def step_size(self, server_round: int) -> float:
        """The learning rate of round ``server_round``: ``eta``."""
        return self.eta


@dataclass(frozen=True)
class ServerAdagrad(AdaptiveOptimizer):
    """FedAdagrad's step: ``v_t = v_{t-1} + Delta_t^2``, no first-moment decay.

    Defaults as Flower's ``FedAdagrad``: ``eta = 0.1``, ``tau = 1e-3`` and
    ``beta_1 = 0`` (``m_t = Delta_t``).

    Examples
    --------
    >>> new, state = ServerAdagrad().step(
    ...     {"w": np.array([1.0])}, {"w": np.array([2.0])}, OptimizerState(), 1
    ... )
    >>> round(float(new["w"][0]), 6)  # 1 + 0.1 * 1 / (1 + 1e-3)
    1.0999
    """

    eta: float = 0.1
    beta_1: float = 0.0
    beta_2: float = 0.0
    tau: float = 1e-3
    flower_name: str = field(init=False, default="FedAdagrad", repr=False)

    def second_moment(
        self, previous: NDArray[np.floating], squared: NDArray[np.floating]
    ) -> NDArray[np.floating]:
        """``v_{t-1} + Delta_t^2``."""
        return previous + squared

    def settings(self) -> dict[str, float]:
        """``eta``, ``beta_1`` and ``tau`` (Adagrad has no ``beta_2``)."""
        return {"eta": self.eta, "beta_1": self.beta_1, "tau": self.tau}


@dataclass(frozen=True)
class ServerYogi(AdaptiveOptimizer):
    """FedYogi's step, whose ``v_t`` moves by ``(1 - beta_2) Delta_t^2`` at most.

    ``v_t = v_{t-1} - (1 - beta_2) Delta_t^2 sign(v_{t-1} - Delta_t^2)``.

    Defaults as Flower's ``FedYogi``: ``eta = 0.01``, ``beta_1 = 0.9``,
    ``beta_2 = 0.99``, ``tau = 1e-3``.

    Examples
    --------
    >>> new, _ = ServerYogi().step(
    ...     {"w": np.array([0.0])}, {"w": np.array([1.0])}, OptimizerState(), 1
    ... )
    >>> round(float(new["w"][0]), 6)  # 0.01 * 0.1 / (sqrt(0.01) + 1e-3)
    0.009901
    """

    eta: float = 0.01
    flower_name: str = field(init=False, default="FedYogi", repr=False)

    def second_moment(
        self, previous: NDArray[np.floating], squared: NDArray[np.floating]
    ) -> NDArray[np.floating]:
        """``v_{t-1} - (1 - beta_2) Delta_t^2 sign(v_{t-1} - Delta_t^2)``."""
        return previous - (1.0 - self.beta_2) * squared * np.sign(previous - squared)


@dataclass(frozen=True)
class ServerAdam(AdaptiveOptimizer):
    """FedAdam's step: ``v_t = beta_2 v_{t-1} + (1 - beta_2) Delta_t^2``.

    Defaults as Flower's ``FedAdam``: ``eta = 0.1``, ``beta_1 = 0.9``,
    ``beta_2 = 0.99``, ``tau = 1e-3``. The learning rate of round ``t`` is
    ``eta sqrt(1 - beta_2^(t + 1)) / (1 - beta_1^(t + 1))``, Flower's bias
    correction keyed on the server round (Algorithm 2 has none).

    Examples
    --------
    >>> round(ServerAdam().step_size(1), 6)  # 0.1 sqrt(1 - 0.99^2) / (1 - 0.9^2)
    0.074246
    """

    flower_name: str = field(init=False, default="FedAdam", repr=False)

    def second_moment(
        self, previous: NDArray[np.floating], squared: NDArray[np.floating]
    ) -> NDArray[np.floating]:
        """``beta_2 v_{t-1} + (1 - beta_2) Delta_t^2``."""
        return self.beta_2 * previous + (1 - self.beta_2) * squared

    def step_size(self, server_round: int) -> float:
        """``eta sqrt(1 - beta_2^(t + 1)) / (1 - beta_1^(t + 1))`` at round ``t``."""
        return float(
            self.eta
            * np.sqrt(1 - np.power(self.beta_2, server_round + 1.0))
            / (1 - np.power(self.beta_1, server_round + 1.0))
        )


@dataclass(frozen=True)
class ServerMomentum(ServerOptimizer):
    """FedAvgM's step: server SGD with momentum on ``g_t = -Delta_t``.

    ``u_t = momentum u_{t-1} + g_t`` (``u_1 = g_1``), ``x_{t+1} = x_t - lr
    u_t``; without momentum, ``x_t + lr Delta_t``. Defaults as Flower's
    ``FedAvgM``, whose step at ``lr = 1`` and ``momentum = 0`` is skipped (the
    default step, which is what this one computes too).

    Parameters
    ----------
    lr : float
        Server learning rate (> 0); Flower's ``server_learning_rate``.
    momentum : float
        Momentum, in [0, 1); Flower's ``server_momentum``.

    Examples
    --------
    >>> optimizer = ServerMomentum(lr=1.0, momentum=0.5)
    >>> x, state = optimizer.step(
    ...     {"w": np.array([0.0])}, {"w": np.array([1.0])}, OptimizerState(), 1
    ... )
    >>> x, _ = optimizer.step(x, {"w": np.array([2.0])}, state, 2)
    >>> float(x["w"][0])  # 1 + (0.5 * 1 + 1)
    2.5
    """

    lr: float = 1.0
    momentum: float = 0.0
    flower_name: str = field(init=False, default="FedAvgM", repr=False)

    def __post_init__(self) -> None:
        """Check the settings."""
        check_positive("lr", self.lr)
        _check_fraction("momentum", self.momentum)

    def settings(self) -> dict[str, float]:
        """``lr`` and ``momentum``."""
        return {"lr": self.lr, "momentum": self.momentum}

    def move(
        self,
        current: dict[str, NDArray[np.floating]],
        delta: dict[str, NDArray[np.floating]],
        state: OptimizerState,
        server_round: int,
    ) -> tuple[dict[str, NDArray[np.floating]], OptimizerState]:
        """``x_t - lr u_t`` with ``u_t = momentum u_{t-1} - Delta_t``."""
        gradient = {key: -value for key, value in delta.items()}
        if self.momentum > 0.0 and state.first:
            gradient = {
                key: self.momentum * state.first[key] + value
                for key, value in gradient.items()
            }
        moved = {key: value - self.lr * gradient[key] for key, value in current.items()}
        buffer = gradient if self.momentum > 0.0 else {}
        return moved, OptimizerState(first=buffer)
