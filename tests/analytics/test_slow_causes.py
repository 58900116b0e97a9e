"""Slow causes weighed by what they cost, on scripted runs of the real engine whose truth is known.

Session A builds a long context over five steps (the first cold, the next four hitting the cache: enough that one
of them slowed by the machine leaves its session's typical step as it is), pauses, and meanwhile session B's request
needs the room and evicts most of A's cached prefix. Then A's sixth step:
- `prefix_lost`: B has finished when A comes back: A's step waits for nothing and recomputes the lost prefix;
- `queue_behind`: the engine runs one request at a time and B is still decoding a long reply when A comes back:
  A's step waits seconds in the queue, then recomputes the same lost prefix in a fraction of a second.
Both steps lost their prefix in the pause; only the first was slow because of it. The verdict must say so, with the
recompute estimate close to the prefill time the loss really added.
"""

from __future__ import annotations

import pytest

from instrumented_engine.observers.store import StoreRecorder
from instrumented_engine.sampling_params import SamplingParams
from kvobs.analytics.cache.prefill_rates import PrefillRates
from kvobs.analytics.cache.routing import MISS_PARTS
from kvobs.analytics.cache.shortfall_split import shortfall, store_lookups
from kvobs.analytics.steps.attribution import ATTRIBUTION_KINDS, attribute_steps
from kvobs.analytics.steps.causes import step_causes
from kvobs.store import StoreWriter, open_store
from kvobs.store.rows import StepRecord

BLOCK = 16
CONTEXT = [200 + (i * 7) % 5000 for i in range(400)]  # A's context: 25 blocks
OTHER = [6000 + (i * 11) % 3000 for i in range(480)]  # B's prompt: nothing in common with A's
BACK = 5  # the step A comes back with, after the pause
LAST, BEFORE = f"a{BACK}", f"a{BACK - 1}"  # its request, and the one before the pause
HITS = [f"a{i}" for i in range(1, BACK)]  # the requests that found their prefix cached


def _run(make_llm, tmp_path, *, queue_behind: bool, tier_bytes: int | None = None):
    llm = make_llm(
        num_blocks=44,
        block_size=BLOCK,
        max_model_len=640,
        max_num_seqs=1 if queue_behind else 8,
        kv_offloading_size=tier_bytes,
    )
    engine = llm.engine
    store = open_store(f"sqlite:///{tmp_path / 'run.db'}")
    writer = StoreWriter(store)
    recorder = StoreRecorder(writer, instance="scripted", block_size=BLOCK, medium="CPU")
    outputs = {}

    def step() -> None:
        result = engine.step()
        recorder.on_step(result)
        for out in result.outputs:
            if out.finished:
                outputs[out.request_id] = out

    def request(rid: str, session: str, tokens: list[int], max_tokens: int) -> None:
        engine.add_request(
            tokens, SamplingParams(temperature=0, max_tokens=max_tokens), request_id=rid, session_id=session
        )

    def finish() -> None:
        while engine.has_unfinished_requests():
            step()

    context = list(CONTEXT)
    for i in range(BACK):  # A's steps before the pause: cold, then its prefix hits
        request(f"a{i}", "A", context, 4)
        finish()
        context = context + outputs[f"a{i}"].output_token_ids + [300 + i] * 12
    request("b", "B", OTHER, 120 if queue_behind else 4)  # B needs the room A left cached
    if queue_behind:
        for _ in range(6):  # B admitted and decoding when A comes back
            step()
    else:
        finish()
    request(LAST, "A", context, 4)
    finish()
    for i in range(BACK + 1):  # A's steps as its agent saw them: started when it sent the request, ended at the reply
        out = outputs[f"a{i}"]
        writer.add(
            StepRecord(
                session_id="A",
                step_index=i,
                started_at=out.arrival_ts,
                ended_at=out.finished_ts,
                status="ok",
                ttft_s=out.first_token_ts - out.arrival_ts,
                e2e_s=out.finished_ts - out.arrival_ts,
            )
        )
    writer.close()
    return store, outputs


@pytest.fixture(scope="module", params=["prefix_lost", "queue_behind"])
def scripted(request, make_llm, tmp_path_factory):
    store, outputs = _run(
        make_llm, tmp_path_factory.mktemp(request.param), queue_behind=request.param == "queue_behind"
    )
    frame = step_causes(store, None, None).set_index("step_index")
    return request.param, store, outputs, frame


def test_both_scripts_lost_the_prefix_in_the_pause(scripted):
    name, store, outputs, frame = scripted
    last = frame.loc[BACK]
    assert last["blocks_lost_in_pause"] >= 10  # B evicted most of A's cached context while A was idle
    assert "prefix_evicted_in_pause" in last["causes"].split(",")
    assert outputs[LAST].num_cached_tokens < outputs[BEFORE].num_cached_tokens  # it really recomputed


def test_the_slow_cause_is_the_part_that_cost_the_time(scripted):
    name, store, outputs, frame = scripted
    last = frame.loc[BACK]
    back = store.reads.requests().set_index("request_id").loc[LAST]
    assert bool(last["slow"])
    if name == "prefix_lost":
        assert back["queue_s"] < 0.05  # truth: nothing to wait for
        assert last["slow_cause"] == "prefix_evicted_in_pause"
        assert last["evidence"].startswith("slow: recomputing the prefix lost in the tool pause: ")
    else:
        assert back["queue_s"] > 1.0  # truth: it waited behind B's reply
        assert last["slow_cause"] == "queue_wait" and last["cause"] == "queue_wait"
        assert last["evidence"].startswith("slow: waiting in the queue: ")
        assert last["lost_recompute_s"] < 0.5 * back["queue_s"]  # the loss was real, and cost far less
    assert "s prefill to recompute (" in last["evidence"] and "tokens/s, its own prefill's pace" in last["evidence"]


def test_the_recompute_estimate_is_close_to_the_prefill_the_loss_added(scripted):
    """The estimate comes from the instance's measured prefill cost; the truth is what A's prefill took beyond the
    prefill of its earlier cache-hitting steps."""
    name, store, outputs, frame = scripted
    last = frame.loc[BACK]
    reqs = store.reads.requests().set_index("request_id")
    prefill = reqs["first_token_ts"] - (reqs["arrival_ts"] + reqs["queue_s"])
    added = prefill[LAST] - prefill[HITS].mean()
    assert added > 0.02
    assert 0.4 * added <= last["lost_recompute_s"] <= 2.5 * added, (last["lost_recompute_s"], added)


def test_a_model_error_after_the_lost_prefix_fails_for_the_model_and_is_slow_for_the_cache(scripted):
    """The same step failing: with invalid_response it failed because of the model and was slow because of what cost
    it time; timing out instead, the part that cost the time is its failure cause."""
    name, store, outputs, frame = scripted
    steps, reqs = store.reads.steps(), store.reads.requests()
    events = store.reads.kv_events(kinds=ATTRIBUTION_KINDS)
    rates = PrefillRates(reqs)
    for error, cause, kind in (
        ("invalid_response", "invalid_response", "model"),
        ("timeout", frame.loc[BACK, "slow_cause"], "queue" if name == "queue_behind" else "cache"),
    ):
        failed = steps.assign(
            status=["error" if i == BACK else "ok" for i in steps["step_index"]],
            error_type=[error if i == BACK else None for i in steps["step_index"]],
        )
        row = attribute_steps(failed, reqs, events, rates=rates).set_index("step_index").loc[BACK]
        assert (row["failure_cause"], row["failure_kind"]) == (cause, kind)
        assert row["slow_cause"] == frame.loc[BACK, "slow_cause"]  # slow for the same reason either way


def test_the_shortfall_split_names_the_pause_and_the_new_tail(scripted):
    """A's request after the pause: what it found, what the pause took and what it never had, in whole blocks,
    against the truth of the script: A's request before the pause left its prompt and reply cached (in full blocks);
    what of them the request after did not find was evicted by B while A waited; the rest of its prompt was new."""
    name, store, outputs, frame = scripted
    reqs = store.reads.requests()
    lookups, _ = store_lookups(store, reqs, store.reads.steps(), None, None)
    row = lookups.set_index("request_id").loc[LAST]
    before = reqs.set_index("request_id").loc[BEFORE]
    prompt_blocks = (int(reqs.set_index("request_id").loc[LAST, "prompt_tokens"]) - 1) // BLOCK
    had = min((int(before["prompt_tokens"]) + len(outputs[BEFORE].output_token_ids)) // BLOCK, prompt_blocks)
    own = outputs[LAST].num_cached_tokens // BLOCK
    assert row["prompt_blocks"] == prompt_blocks and row["own_blocks"] == own
    assert row["pause_blocks"] == had - own >= 10
    assert row["cold_blocks"] == prompt_blocks - had
    assert row["capacity_blocks"] == row["invalidated_blocks"] == row["routed_blocks"] == row["unexplained_blocks"] == 0
    table = shortfall(lookups, "session_id").set_index("session_id")
    parts = [f"{p}_tokens" for p in MISS_PARTS]
    assert (table["achieved_tokens"] + table[parts].sum(axis=1) == table["prompt_block_tokens"]).all()  # adds up
    assert (table["available_tokens"] == table["prompt_block_tokens"] - table["cold_tokens"]).all()


def test_a_pause_loss_the_offload_tier_saved_is_no_loss_and_says_so(make_llm, tmp_path):
    """The same script with a CPU tier that holds A's whole context: B still evicts A's blocks from the cache during
    the pause (the engine's record), but A's step after the pause loads every one of them back from the tier. Its
    verdict loses no prefix in the pause and says what the tier gave back; the request's cached tokens are A's
    context again."""
    store, outputs = _run(make_llm, tmp_path, queue_behind=False, tier_bytes=64 * 737_280)  # 64 blocks
    rows = store.reads.kv_events(kinds=["evicted", "tier_loaded"])
    evicted = set(rows.loc[(rows["kind"] == "evicted") & (rows["session_id"] == "A"), "block_hash"])
    loaded = set(rows.loc[(rows["kind"] == "tier_loaded") & (rows["request_id"] == LAST), "block_hash"])
    assert len(evicted) >= 10 and evicted <= loaded  # truth: every block the pause took came back from the tier
    frame = step_causes(store, None, None).set_index("step_index")
    last = frame.loc[BACK]
    assert last["blocks_lost_in_pause"] == 0 and "prefix_evicted_in_pause" not in last["causes"].split(",")
    assert (
        f"{len(evicted)} of its cached blocks ({len(evicted) * BLOCK} tokens) evicted from the cache"
        in last["evidence"]
    )
    assert "were loaded back from the offload tier, not recomputed" in last["evidence"]
    assert "their load time is not measured (no load counter scraped around it)" in last["evidence"]  # offline
    assert outputs[LAST].num_cached_tokens >= outputs[BEFORE].num_cached_tokens  # nothing recomputed
    # `kvobs doctor`: its stored blocks still agree with its own request rows (loaded tokens are stored again, as
    # computed ones: no hit of the cache's)
    from kvobs.analytics.cache.agreement import kv_counter_agreement

    (check,) = kv_counter_agreement(store)
    assert check.verdict == "agree", check.words
