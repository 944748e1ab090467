"""``nn.LSTM``, ``nn.GRU`` and ``nn.MultiheadAttention`` through their linear pieces.

Their fused kernels hide what a per-sample gradient needs (each gate's
pre-activation at each time step, each projection's input), and torch.func
has no batching rule for the CPU LSTM kernel. While the layer-wise path
records a forward pass, these layers run the same maths from the same
parameters, written as linear maps plus elementwise functions, and record
each linear map as a :class:`~flwr_importance.per_sample.pieces.DensePiece`:

* LSTM: the gate pre-activations ``x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh``
  are computed for all steps' input part at once; their gradient ``D`` serves
  both weights and both biases, recorded as one piece (``[W_ih | W_hh]`` on
  ``[x_t, h_{t-1}]``). The recurrence itself is an autograd Function with a
  hand-written backward (:class:`_LSTMRecurrence`): recording its small
  per-step operations for autograd cost more than their arithmetic.
* GRU: the hidden part ``h_{t-1} W_hh^T + b_hh`` is gated by ``r_t`` before it
  is added, so its gradient is read off a zero offset added to it at each step.
* Multi-head attention: the query, key and value projections (rows of
  ``in_proj_weight``) and the output projection; the attention itself has no
  parameter.

Each returns what the layer's own ``forward`` returns; options that change
the maths beyond these (``proj_size``, ``bias_k``, ``add_zero_attn``) are left
to torch.func (:func:`~flwr_importance.per_sample.capture.unrolled_supported`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from flwr_importance.per_sample.pieces import DensePiece, Recorder, edge_of


def unrolled_forward(module: nn.Module, recorder: Recorder) -> Callable[..., Any]:
    """The layer's ``forward``, through its linear pieces, recording them."""
    if isinstance(module, nn.MultiheadAttention):
        return lambda *args, **kwargs: attention_forward(
            module, recorder, *args, **kwargs
        )
    assert isinstance(module, nn.LSTM | nn.GRU)
    return lambda *args, **kwargs: recurrent_forward(module, recorder, *args, **kwargs)


def sequence_piece(
    weight: Tensor,
    bias: Tensor | None,
    inputs: Tensor,
    output: Tensor,
    rows: slice | None = None,
    bias_rows: slice | None = None,
    beside: tuple[tuple[Tensor, Tensor | None], ...] = (),
) -> DensePiece:
    """A dense piece over ``(B, T, features)`` inputs and outputs."""
    edge, shape = edge_of(output)
    batch_size = inputs.shape[0]
    return DensePiece(
        weight=weight,
        bias=bias,
        inputs=inputs.unsqueeze(1),
        output=edge,
        output_shape=shape,
        layout=lambda grad: grad.reshape(batch_size, 1, -1, grad.shape[-1]),
        rows=slice(None) if rows is None else rows,
        bias_rows=slice(None) if bias_rows is None else bias_rows,
        beside=beside,
    )


def recurrent_forward(
    module: nn.LSTM | nn.GRU,
    recorder: Recorder,
    sequence: Tensor,
    hx: Tensor | tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor | tuple[Tensor, Tensor]]:
    """``nn.LSTM``/``nn.GRU`` forward, layer by layer and step by step.

    Returns ``(output, h_n)`` for a GRU and ``(output, (h_n, c_n))`` for an
    LSTM, in the layer's own layout (``batch_first`` or not).
    """
    is_lstm = isinstance(module, nn.LSTM)
    if not isinstance(sequence, Tensor) or sequence.dim() != 3:
        recorder.problems.append(f"{type(module).__name__} needs a batched tensor")
        return type(module).forward(module, sequence, hx)  # type: ignore[arg-type]
    if not module.batch_first:
        sequence = sequence.transpose(0, 1)
    batch_size = sequence.shape[0]
    directions = 2 if module.bidirectional else 1
    states = module.num_layers * directions
    zeros = sequence.new_zeros(states, batch_size, module.hidden_size)
    if hx is None:
        h_start, c_start = zeros, zeros
    elif is_lstm:
        assert isinstance(hx, tuple)
        h_start, c_start = hx
    else:
        assert isinstance(hx, Tensor)
        h_start, c_start = hx, zeros
    layer_input = sequence
    h_final, c_final = [], []
    for layer in range(module.num_layers):
        outputs = []
        for direction in range(directions):
            state = layer * directions + direction
            suffix = f"_l{layer}" + ("_reverse" if direction else "")
            steps = layer_input.flip(1) if direction else layer_input
            run = _lstm_layer if is_lstm else _gru_layer
            output, h_last, c_last = run(
                _LayerCall(
                    recorder,
                    *_parameters(module, suffix),
                    steps,
                    h_start[state],
                    c_start[state],
                )
            )
            outputs.append(output.flip(1) if direction else output)
            h_final.append(h_last)
            c_final.append(c_last)
        layer_input = torch.cat(outputs, dim=2) if directions > 1 else outputs[0]
        if module.dropout > 0 and layer < module.num_layers - 1:
            layer_input = F.dropout(layer_input, module.dropout, module.training)
    output = layer_input if module.batch_first else layer_input.transpose(0, 1)
    h_n = torch.stack(h_final)
    return (output, (h_n, torch.stack(c_final))) if is_lstm else (output, h_n)


def _parameters(
    module: nn.Module, suffix: str
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """``W_ih, W_hh, b_ih, b_hh`` of one layer and direction."""
    biases = (
        (getattr(module, f"bias_ih{suffix}"), getattr(module, f"bias_hh{suffix}"))
        if module.bias
        else (None, None)
    )
    return (
        getattr(module, f"weight_ih{suffix}"),
        getattr(module, f"weight_hh{suffix}"),
        *biases,
    )


@dataclass(frozen=True)
class _LayerCall:
    """One layer in one direction, and where to record its pieces.

    Its parameters, ``(B, T, in)`` input and initial states (the cell state
    unused by a GRU).
    """

    recorder: Recorder
    weight_ih: Tensor
    weight_hh: Tensor
    bias_ih: Tensor | None
    bias_hh: Tensor | None
    steps: Tensor
    h: Tensor
    c: Tensor


def _lstm_layer(call: _LayerCall) -> tuple[Tensor, Tensor, Tensor]:
    """One LSTM layer in one direction; gates i, f, g, o."""
    bias_ih, bias_hh = call.bias_ih, call.bias_hh
    bias = None if bias_ih is None or bias_hh is None else bias_ih + bias_hh
    input_part = F.linear(call.steps, call.weight_ih, bias)
    # The weights' gradients come from the pieces, not from autograd.
    states, c_last = _LSTMRecurrence.apply(
        input_part, call.h, call.c, call.weight_hh.detach()
    )
    # Both weights see the same gate gradient, d loss / d input_part: one
    # piece, W_hh on h_{t-1} beside W_ih on x_t.
    recorder = call.recorder
    joint = torch.cat((recorder.saved(call.steps), states[:, :-1].detach()), dim=2)
    recorder.pieces.append(
        sequence_piece(
            call.weight_ih,
            bias_ih,
            joint,
            input_part,
            beside=((call.weight_hh, bias_hh),),
        )
    )
    return states[:, 1:], states[:, -1], c_last


class _LSTMRecurrence(torch.autograd.Function):
    """The recurrence of one LSTM layer, differentiated by hand.

    Input: the gate pre-activations' input part ``x_t W_ih^T + b_ih + b_hh``
    ``(B, T, 4H)``; the recurrence adds ``h_{t-1} W_hh^T`` step by step. The
    gradient it returns for that input part is ``D``, the gradient of the
    full gate pre-activations: what both weights' pieces need. Autograd
    recording each step's half-dozen small operations (and replaying their
    backward nodes) cost more than the arithmetic; here the forward steps run
    unrecorded into preallocated buffers and the backward is one fused
    recursion (five operations a step), with everything that does not depend
    on the previous step computed for all steps at once.
    """

    @staticmethod
    def forward(
        ctx: Any, input_part: Tensor, h: Tensor, c: Tensor, weight_hh: Tensor
    ) -> tuple[Tensor, Tensor]:
        """``(B, T + 1, H)`` hidden states from ``h_0`` on, and ``c_T``."""
        batch_size, length, width = input_part.shape
        hidden = width // 4
        # Gate activations i, f, g, o; cells from c_0 on; tanh of the cells.
        gates = input_part.new_empty(batch_size, length, width)
        cells = input_part.new_empty(batch_size, length + 1, hidden)
        cell_tanh = input_part.new_empty(batch_size, length, hidden)
        states = input_part.new_empty(batch_size, length + 1, hidden)
        cells[:, 0] = c
        states[:, 0] = h
        weight_t = weight_hh.T
        # Every step's views, made at once (indexing each step costs as much
        # as the step's small operations).
        inputs = input_part.unbind(1)
        activations = gates.unbind(1)
        in_gate, forget_gate, cell_gate, out_gate = (
            part.unbind(1) for part in gates.chunk(4, dim=2)
        )
        cell, tanh_cell, state = cells.unbind(1), cell_tanh.unbind(1), states.unbind(1)
        cell_rows = slice(2 * hidden, 3 * hidden)
        for t in range(length):
            pre = torch.addmm(inputs[t], state[t], weight_t)
            # One sigmoid over all four gates, the cell gate's then replaced.
            torch.sigmoid(pre, out=activations[t])
            torch.tanh(pre[:, cell_rows], out=cell_gate[t])
            torch.mul(forget_gate[t], cell[t], out=cell[t + 1])
            cell[t + 1].addcmul_(in_gate[t], cell_gate[t])
            torch.tanh(cell[t + 1], out=tanh_cell[t])
            torch.mul(out_gate[t], tanh_cell[t], out=state[t + 1])
        ctx.save_for_backward(gates, cells, cell_tanh, states, weight_hh)
        return states, cells[:, -1].clone()

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_states: Tensor, grad_cell: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, None]:
        """``D``, and the gradients of ``h_0`` and ``c_0``.

        ``D`` is written over the saved gate activations (a second backward
        through the same graph fails on their version counter): fresh
        buffers of this size cost page faults at every step of training.
        """
        gates, cells, cell_tanh, states, weight_hh = ctx.saved_tensors
        _, length, width = gates.shape
        hidden = width // 4
        in_gate, forget_gate, cell_gate, out_gate = gates.chunk(4, dim=2)
        # What does not depend on the step after, for all steps at once:
        # d h_t -> d c_t, and the factors that make D of d c_t (gates i, f,
        # g) and of d h_t (gate o), those in place of the activations. Each
        # a(1 - b c) as a - (a b) c: one pass over the steps, not three.
        forget = forget_gate.clone()
        new_states = states[:, 1:]  # o tanh(c)
        # o (1 - tanh(c)^2), and o (1 - o) tanh(c).
        to_cell = torch.addcmul(out_gate, new_states, cell_tanh, value=-1)
        torch.addcmul(new_states, new_states, out_gate, value=-1, out=out_gate)
        # i (1 - g^2), and g i (1 - i).
        cell_in = cell_gate * in_gate
        torch.addcmul(in_gate, cell_in, cell_gate, value=-1, out=cell_gate)
        torch.addcmul(cell_in, cell_in, in_gate, value=-1, out=in_gate)
        # c_{t-1} f (1 - f).
        cell_forget = cells[:, :-1] * forget_gate
        torch.addcmul(cell_forget, cell_forget, forget_gate, value=-1, out=forget_gate)
        grads = gates
        # D_t's parts from d c_t (as (B, 3, H)) and from d h_t, every step's.
        from_cell = grads[..., : 3 * hidden].unflatten(2, (3, hidden)).unbind(1)
        from_state = out_gate.unbind(1)
        grad_step, grad_state = grads.unbind(1), grad_states.unbind(1)
        to_cell_step, forget_step = to_cell.unbind(1), forget.unbind(1)
        grad_h = grad_state[length]
        grad_c = grad_cell
        for t in reversed(range(length)):
            if t < length - 1:
                grad_h = torch.addmm(grad_state[t + 1], grad_step[t + 1], weight_hh)
            grad_c = torch.addcmul(grad_c, grad_h, to_cell_step[t])
            from_cell[t].mul_(grad_c.unsqueeze(1))
            from_state[t].mul_(grad_h)
            grad_c = grad_c * forget_step[t]
        grad_h0 = torch.addmm(grad_state[0], grad_step[0], weight_hh)
        return grads, grad_h0, grad_c, None


def _gru_layer(call: _LayerCall) -> tuple[Tensor, Tensor, Tensor]:
    """One GRU layer in one direction; gates r, z, n."""
    recorder, steps, h = call.recorder, call.steps, call.h
    input_part = F.linear(steps, call.weight_ih, call.bias_ih)
    batch_size, length, width = input_part.shape
    # A zero added to every step's hidden part: its gradient is that part's.
    offset = input_part.new_zeros(batch_size, length, width, requires_grad=True)
    previous, outputs = [], []
    for step_input, step_offset in zip(
        input_part.unbind(dim=1), offset.unbind(dim=1), strict=True
    ):
        previous.append(h)
        hidden_part = F.linear(h, call.weight_hh, call.bias_hh) + step_offset
        input_r, input_z, input_n = step_input.chunk(3, dim=1)
        hidden_r, hidden_z, hidden_n = hidden_part.chunk(3, dim=1)
        reset = torch.sigmoid(input_r + hidden_r)
        update = torch.sigmoid(input_z + hidden_z)
        candidate = torch.tanh(input_n + reset * hidden_n)
        h = (1 - update) * candidate + update * h
        outputs.append(h)
    recorder.pieces.append(
        sequence_piece(call.weight_ih, call.bias_ih, recorder.saved(steps), input_part)
    )
    hidden = torch.stack(previous, dim=1).detach()
    recorder.pieces.append(sequence_piece(call.weight_hh, call.bias_hh, hidden, offset))
    return torch.stack(outputs, dim=1), h, call.c


def attention_forward(
    module: nn.MultiheadAttention,
    recorder: Recorder,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_padding_mask: Tensor | None = None,
    need_weights: bool = True,
    attn_mask: Tensor | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``nn.MultiheadAttention.forward`` from its projections, recording them."""
    if query.dim() != 3:
        recorder.problems.append("MultiheadAttention needs batched inputs")
        return nn.MultiheadAttention.forward(
            module, query, key, value, key_padding_mask, need_weights, attn_mask
        )
    if not module.batch_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    width, heads = module.embed_dim, module.num_heads
    projected = []
    for index, source in enumerate((query, key, value)):
        rows = slice(index * width, (index + 1) * width)
        if module._qkv_same_embed_dim:
            weight, weight_rows = module.in_proj_weight, rows
        else:
            weight = (module.q_proj_weight, module.k_proj_weight, module.v_proj_weight)[
                index
            ]
            weight_rows = slice(None)
        bias = module.in_proj_bias
        projection = F.linear(
            source, weight[weight_rows], None if bias is None else bias[rows]
        )
        recorder.pieces.append(
            sequence_piece(
                weight,
                bias,
                recorder.saved(source),
                projection,
                rows=weight_rows,
                bias_rows=rows,
            )
        )
        batch_size, length = projection.shape[:2]
        projected.append(
            projection.reshape(batch_size, length, heads, -1).transpose(1, 2)
        )
    q, k, v = projected
    mask = _additive_mask(
        attn_mask,
        key_padding_mask,
        is_causal,
        q.shape[0],
        heads,
        q.shape[2],
        k.shape[2],
        q,
    )
    dropout = module.dropout if module.training else 0.0
    weights = None
    if need_weights:
        scores = q @ k.transpose(2, 3) / math.sqrt(q.shape[3])
        if mask is not None:
            scores = scores + mask
        weights = torch.softmax(scores, dim=3)
        attended = F.dropout(weights, dropout, module.training) @ v
        if average_attn_weights:
            weights = weights.mean(dim=1)
    else:
        attended = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout
        )
    attended = attended.transpose(1, 2).flatten(start_dim=2)
    out_proj = module.out_proj
    output = F.linear(attended, out_proj.weight, out_proj.bias)
    recorder.pieces.append(
        sequence_piece(out_proj.weight, out_proj.bias, attended.detach(), output)
    )
    if not module.batch_first:
        output = output.transpose(0, 1)
    return output, weights


def _additive_mask(
    attn_mask: Tensor | None,
    key_padding_mask: Tensor | None,
    is_causal: bool,
    batch_size: int,
    heads: int,
    target: int,
    source: int,
    like: Tensor,
) -> Tensor | None:
    """The attention and padding masks as one additive ``(B, H, T, S)`` mask."""
    masks = []
    if attn_mask is None and is_causal:
        attn_mask = torch.ones(
            target, source, dtype=torch.bool, device=like.device
        ).triu(1)
    if attn_mask is not None:
        shape = (
            (1, 1, target, source)
            if attn_mask.dim() == 2
            else (batch_size, heads, target, source)
        )
        masks.append(_additive(attn_mask, like).reshape(shape))
    if key_padding_mask is not None:
        masks.append(
            _additive(key_padding_mask, like).reshape(batch_size, 1, 1, source)
        )
    if not masks:
        return None
    return masks[0] if len(masks) == 1 else masks[0] + masks[1]


def _additive(mask: Tensor, like: Tensor) -> Tensor:
    """A boolean mask (True: not attended) as ``-inf``/0; a float mask as is."""
    if mask.dtype == torch.bool:
        return torch.zeros(
            mask.shape, dtype=like.dtype, device=like.device
        ).masked_fill(mask, float("-inf"))
    return mask.to(like.dtype)
