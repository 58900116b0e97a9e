"""Linear layers with oneDNN-prepacked weights compute what nn.Linear computes, replace every linear of the
model, and are left out where they cannot be used or are switched off."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from instrumented_engine.layers import linear as linear_module
from instrumented_engine.layers.linear import PREPACK_ENV, PrepackedLinear, can_prepack, prepack_linears

packing_refused = linear_module.packing_refused


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 16, 300])
def test_prepacked_equals_nn_linear(dtype, bias, rows):
    if packing_refused(dtype):  # bfloat16 on a CPU without avx512bw/vl/dq: the next test covers what happens there
        pytest.skip(f"oneDNN cannot pack {dtype} on this CPU: {packing_refused(dtype)}")
    torch.manual_seed(rows)
    linear = nn.Linear(576, 960, bias=bias).to(dtype)
    x = torch.randn(rows, 576).to(dtype)
    want = linear(x)
    got = PrepackedLinear(linear, batch_hint=16)(x)
    assert got.dtype == dtype and got.shape == want.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # another blocking of the same sums
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)) for _ in range(2))
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight  # tied, as SmolLM2's

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def test_every_linear_is_replaced_and_the_outputs_stay():
    model = Tiny().eval()
    ids = torch.tensor([1, 5, 9])
    with torch.no_grad():
        want = model(ids)
        assert prepack_linears(model, batch_hint=4) == 5
        got = model(ids)
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert model.embed.weight.shape == (10, 8)  # the tied embedding keeps its weight
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_packing_refused_says_what_oneDNN_does_on_this_cpu():
    for dtype in (torch.float32, torch.bfloat16):
        linear = nn.Linear(64, 32).to(dtype)
        if packing_refused(dtype):
            with pytest.raises(RuntimeError):
                PrepackedLinear(linear, batch_hint=4)
            assert can_prepack(torch.device("cpu"), dtype)[0] is False
        else:
            PrepackedLinear(linear, batch_hint=4)
            assert can_prepack(torch.device("cpu"), dtype) == (True, "")
    assert packing_refused(torch.float32) == ""  # fp32 packs wherever oneDNN runs


def test_a_cpu_that_cannot_pack_bfloat16_keeps_nn_linear(monkeypatch):
    refusal = "mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or avx512bw, ..."
    monkeypatch.setattr(linear_module, "packing_refused", lambda dtype: refusal if dtype == torch.bfloat16 else "")
    ok, why = can_prepack(torch.device("cpu"), torch.bfloat16)
    assert not ok and "cannot pack torch.bfloat16 on this CPU" in why and "avx512bw" in why
    assert can_prepack(torch.device("cpu"), torch.float32) == (True, "")


def test_where_prepacking_is_not_used(monkeypatch):
    assert can_prepack(torch.device("cuda"), torch.bfloat16)[0] is False
    assert can_prepack(torch.device("cpu"), torch.float16)[0] is False
    monkeypatch.setenv(PREPACK_ENV, "0")
    ok, why = can_prepack(torch.device("cpu"), torch.float32)
    assert not ok and PREPACK_ENV in why


def test_the_engine_prepacks_on_the_cpu_and_says_so(make_llm, caplog):
    with caplog.at_level("INFO", logger="instrumented_engine.engine.model_runner"):
        llm = make_llm(num_blocks=80)
    runner = llm.engine.runner
    assert isinstance(runner.model.lm_head, PrepackedLinear)
    assert runner.linears == "121 prepacked (oneDNN)"  # 30 layers x (qkv, o, gate_up, down) + lm_head
    assert "linears: 121 prepacked" in caplog.text
