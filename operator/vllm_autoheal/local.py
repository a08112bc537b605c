"""`vllm-autoheal serve`: supervise a vLLM server on this machine with the operator's brain.

Start vLLM, stream its output, wait for /health; when it dies: classify -> plan ->
restart with the new flags, inside the same bounds and attempt limits as the
operator. Every heal is one printed line and one record in a JSON-lines history
file, so a later `serve` of the same command starts from the flags that worked.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import cgroups, serve_sizing
from .api import EngineArgs, VLLMServiceSpec
from .diagnosis import GpuSnapshot, Signals, classify
from .engine import describe, redacted, to_command
from .engine_death import DeathWatch, engine_dead, health_status
from .gpu_probe import snapshot
from .launcher import OutputKeeper, pump
from .model_shape import ModelShape
from .remedy import Remedy, plan_heal
from .remedy_gate import Limits, fingerprint
from .serve_client import base_url, complete_one
from .serve_history import append_record, read_records, recorded, remembered, run_model
from .serve_process import Mutable, exit_status, join, on_stop_signals, stop_group
from .vllm_command import VllmUnavailable, vllm_start

# How far a start got, by the phase it failed in: a heal whose next start fails earlier made it worse.
PROGRESS = {"load": 0, "profile": 1, "kv-allocation": 2, "graph-capture": 3, "serving": 4}


def default_history_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "vllm-autoheal" / "history.jsonl"


@dataclass
class ServeOptions:
    model: str
    spec: VLLMServiceSpec
    serve_args: list[str] = field(default_factory=list)  # --host/--port and other server flags
    host: str = "127.0.0.1"
    port: int = 8000
    python: str = sys.executable
    history_path: Path = field(default_factory=default_history_path)
    once: bool = False
    fresh: bool = False
    startup_timeout: float = 1800.0


@dataclass
class Attempt:
    exit_code: int | None
    ready: bool
    log: str
    engine_dead: bool = False
    interrupted: bool = False
    oom_killed: bool = False  # the cgroup's OOM killer fired while it ran


class Supervisor:
    def __init__(self, opts: ServeOptions, out=sys.stdout) -> None:
        self.opts = opts
        self.out = out
        self.child: subprocess.Popen | None = None
        self.stopping = False
        self.signalled: set[int] = set()  # (the signals serve sent the vLLM that runs now)
        self.heals: list[dict[str, Any]] = []  # this run's heals, as the planner's history
        self.failed: set[str] = set()
        self.start = vllm_start(opts.python)
        self.baseline = opts.spec.engine
        self.model = opts.model  # (the quantized fallback's, once a heal switched to it)
        self.key = shlex.join([opts.model, *redacted(to_command(opts.model, self.baseline)[3:])])
        self._shape: ModelShape | None = None
        self._shape_read = False
        self.at_start = GpuSnapshot()  # (NVML's look before the start that crashed: each start takes one)

    def say(self, text: str, prefix: str = "[vllm-autoheal] ") -> None:
        try:
            print(f"{prefix}{text}", file=self.out, flush=True)
        except (OSError, ValueError):  # (its reader is gone, `| tee` that died: supervising goes on)
            pass

    # --- history -------------------------------------------------------------------
    def first_engine(self) -> EngineArgs:
        """The flags that worked last time, when the history holds some that may be used."""
        if self.opts.fresh:
            return self.baseline
        limits = Limits(self.opts.spec.heal.bounds, memory_limit_bytes=cgroups.host_memory())
        records = read_records(self.opts.history_path, self.key)
        model, baseline, why_not = run_model(records, self.opts.model, self.baseline, self.opts.spec.heal)
        if why_not:
            self.say(f"not using the flags in the history {self.opts.history_path}: {why_not}")
            return self.baseline
        engine, why_not = remembered(records, baseline, limits)
        if engine is None:
            if why_not:
                self.say(f"not using the flags in the history {self.opts.history_path}: {why_not}")
            return self.baseline
        if model != self.model:
            self.model = model
            self.say(f"using the quantized fallback {model}, which worked last time")
        self.say(f"using the flags that worked last time (history {self.opts.history_path}): {describe(engine)}")
        return engine

    def record(self, **fields: Any) -> None:
        rec = {
            "time": datetime.now(UTC).isoformat(timespec="seconds"),
            "key": self.key,
            "model": self.model,
            **fields,
        }
        if problem := append_record(self.opts.history_path, rec):
            self.say(f"cannot write history {self.opts.history_path}: {problem}")

    # --- one engine start ----------------------------------------------------------
    def command(self, engine: EngineArgs) -> list[str]:
        return to_command(
            self.model,
            engine,
            api_server_module=self.start.api_server_module,
            vllm_command=self.start.vllm_command,
            python=self.opts.python,
            serve_args=self.opts.serve_args,
        )

    def run_once(self, engine: EngineArgs) -> Attempt:
        cmd = self.command(engine)
        keeper = OutputKeeper()
        death = DeathWatch(self.health_url)
        kills_before = cgroups.oom_kills()

        def watch(line: str) -> None:
            if engine_dead(line):  # (every report: one while a suspicion is open must not be lost)
                death.suspect()

        if self.stopping:  # (a Ctrl-C while the heal was planned: asked to stop, so no further vLLM)
            return Attempt(None, False, "", interrupted=True)
        self.say("starting: " + shlex.join(redacted(cmd)))
        self.signalled = set()
        # Two pipes, not one: a line another process writes into one pipe may land inside a long line
        # (a logged prompt), and the rest of that line would open a line of its own (OutputKeeper).
        self.child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        out = Mutable(sys.stdout.buffer)  # (both streams, as before: each piece written whole)
        pumpers = [
            threading.Thread(target=pump, args=(self.child.stdout, out, keeper, watch, "stdout"), daemon=True),
            threading.Thread(target=pump, args=(self.child.stderr, out, keeper, watch, "stderr"), daemon=True),
        ]
        for pumper in pumpers:
            pumper.start()
        ready, dead, dismissed = False, False, 0
        deadline = time.monotonic() + self.opts.startup_timeout
        while self.child.poll() is None and not self.stopping:
            if not ready and self.healthy():
                ready = True
                self.on_healthy(engine)
                if self.opts.once:
                    ok = self.complete_one()
                    out.muted = True  # vLLM's shutdown (tracebacks, leak warnings) is not the result
                    self.stop()
                    join(pumpers)
                    self.say(
                        f"done: {'served a completion' if ok else 'the completion failed'} after "
                        f"{len(self.heals)} restart(s); vLLM stopped (--once)"
                    )
                    return Attempt(0 if ok else 1, True, keeper.text())
            if death.confirmed():
                self.say("the engine died while the server ran on (its /health answers an error): stopping it")
                dead = True
                self.stop()
                break
            if death.dismissed > dismissed:  # (the line is not quoted: it may be a client's text)
                dismissed = death.dismissed
                self.say("a line reported the engine dead but /health did not confirm it: left running")
            if not ready and time.monotonic() > deadline:
                self.say(f"not healthy after {self.opts.startup_timeout:.0f} s: stopping it")
                self.stop()
                break
            time.sleep(1.0)
        self.stop()  # (also the workers of a vLLM that exited by itself)
        code = exit_status(self.child.wait(), self.signalled)  # (a SIGKILL not serve's reads 137, as the launcher's)
        join(pumpers)
        return Attempt(code, ready, keeper.text(), dead, self.stopping, cgroups.killed_since(kills_before))

    @property
    def health_url(self) -> str:
        return f"{self.base_url}/health"

    @property
    def base_url(self) -> str:
        return base_url(self.opts.host, self.opts.port, self.opts.spec.engine.extra_args)

    def healthy(self) -> bool:
        return health_status(self.health_url) == 200

    def complete_one(self) -> bool:
        name = self.opts.spec.served_model_name or self.model
        ok, said = complete_one(self.base_url, name, self.opts.spec.engine.extra_args)
        self.say(f"completion ok: {said}" if ok else f"completion failed: {said}")
        return ok

    def stop(self) -> None:
        """Stop vLLM and all its workers (serve_process.stop_group), noting the signals serve sent it."""
        if self.child is not None:
            self.signalled |= stop_group(self.child)

    def model_shape(self) -> ModelShape | None:
        """The shape of the model as given, where it is a folder here (read once; serve_sizing.local_shape)."""
        if not self._shape_read:
            self._shape_read, self._shape = True, serve_sizing.local_shape(self.opts.model)
        return self._shape

    def weights_gib(self, engine: EngineArgs) -> float | None:
        return serve_sizing.weights_gib(self.opts.spec, self.model, engine, self.model_shape())

    def plan(
        self, diag: Any, heals: list[dict[str, Any]], inventory: Any, engine: EngineArgs, exclude: set[str]
    ) -> Remedy:
        """The next change, for the model that runs now (the primary's shape: the fallback's is weighed from it
        and the width the policy declares, as the operator does), split over no more GPUs than vLLM sees."""
        spec = serve_sizing.within_visible_gpus(self.opts.spec, engine, self.at_start, os.environ)
        return plan_heal(spec, diag, heals, inventory, engine, failed=self.failed, exclude=exclude, model=self.model)

    # --- the loop --------------------------------------------------------------------
    def serve(self) -> int:
        engine = self.first_engine()
        heals = self.heals
        # (the crash a heal answered, its flags and model, how far it got)
        last: tuple[Any, EngineArgs, int, str] | None = None
        exclude: set[str] = set()
        while True:
            if self.stopping:  # (Ctrl-C while the last crash was read or its heal planned)
                self.say("stopped")
                return 130
            if health_status(self.health_url) is not None:  # (its answers would be taken for this vLLM's)
                self.say(f"another server already answers {self.health_url}: port {self.opts.port} is taken")
                return 2
            # (what other processes leave before vLLM starts bounds a heal's share, as the launcher's probe does)
            at_start = self.at_start = snapshot(own_pids=[os.getpid()])
            attempt = self.run_once(engine)
            if attempt.interrupted:
                self.say("stopped")
                return 130
            if attempt.exit_code == 0 and not attempt.engine_dead:
                if not attempt.ready:  # (nothing to heal, but no server either: say so, exit 1)
                    self.say("vLLM exited with 0 before it ever answered /health: no server, and nothing to heal")
                    return 1
                return 0  # --once done, or vLLM shut down cleanly
            gpu = snapshot(own_pids=[os.getpid()])
            diag = classify(
                Signals(
                    log=attempt.log,
                    exit_code=attempt.exit_code,
                    ready_before=attempt.ready,
                    reason="OOMKilled" if attempt.oom_killed else None,
                    gpu=None if gpu.error else gpu,
                    tensor_parallel_size=engine.tensor_parallel_size,
                    pipeline_parallel_size=engine.pipeline_parallel_size,
                    weights_gib_per_gpu=self.weights_gib(engine),
                )
            )
            if diag.is_memory:  # the gate never goes back to settings that crashed of memory
                self.failed.add(fingerprint(self.model, engine, None))
            progress = PROGRESS.get(diag.phase, -1)
            if last is not None and heals and (progress < last[2] or (last[0].is_memory and not diag.is_memory)):
                # The change made it worse (an earlier failure, or a new non-memory crash with the new
                # flags): go back to the flags that got furthest and try the next remedy for that crash.
                self.say(
                    f"the last change ({heals[-1]['action']}) made it worse: {diag.cause} in {diag.phase}; "
                    f"back to {describe(last[1])}, trying the next remedy"
                )
                self.record(
                    event="undone",
                    action=heals[-1]["action"],
                    cause=diag.cause,
                    phase=diag.phase,
                    evidence=diag.evidence,
                )
                exclude.add(heals[-1]["action"])
                diag, engine, self.model = last[0], last[1], last[3]
            inventory = serve_sizing.inventory(at_start, gpu, engine, self.model_shape(), diag, os.environ)
            remedy = self.plan(diag, heals, inventory, engine, exclude)
            for _ in range(3):  # (a split onto GPUs another process holds more of is sized by what they leave)
                fuller = serve_sizing.onto_fuller_gpus(remedy, engine, inventory, at_start, os.environ)
                if fuller is None:
                    break
                inventory = fuller
                remedy = self.plan(diag, heals, inventory, engine, exclude)
            evidence = diag.evidence[0][:200] if diag.evidence else "no evidence line"
            if remedy.gives_up:
                self.say(
                    f"vLLM exited with {attempt.exit_code}: {diag.cause} ({diag.subtype or diag.phase}) - {evidence}"
                )
                self.say(f"not healing: {remedy.reason}")
                self.record(
                    event="gave_up",
                    cause=diag.cause,
                    subtype=diag.subtype,
                    evidence=diag.evidence,
                    reason=remedy.reason,
                    engine=recorded(engine),
                    gpu_free_gib=inventory.gpu_free_gib,
                )
                return 130 if self.stopping else 1  # (a Ctrl-C meanwhile: stopped as asked, as Ctrl-C exits)
            if self.stopping:  # (Ctrl-C while it was planned: a change never tried is neither said nor recorded)
                self.say("stopped")
                return 130
            before = engine
            last = (diag, before, PROGRESS.get(diag.phase, -1), self.model)
            engine = remedy.apply(engine)
            self.say(f"healed {diag.cause}: {evidence} -> {remedy.flags()} ({remedy.reason})")
            heal: dict[str, Any] = {"cause": diag.cause, "action": remedy.action, "numbers": diag.numbers}
            gpus = before.tensor_parallel_size * before.pipeline_parallel_size
            heal.update(ran_util=before.gpu_memory_utilization, ran_gpus=gpus)  # (plan.outside_budget_ceiling)
            heals.append(heal)
            self.record(
                event="heal",
                **heal,
                evidence=diag.evidence,
                changes=remedy.changes,
                reason=remedy.reason,
                before=recorded(before),
                after=recorded(engine),
                gpu_free_gib=inventory.gpu_free_gib,  # (what sized it, as the operator's heal record keeps it)
            )
            if isinstance(switched := remedy.changes.get("model"), str):  # (Quantize: the fallback from now on)
                self.model = switched

    def on_healthy(self, engine: EngineArgs) -> None:
        heals = self.heals
        self.say(f"healthy: {self.base_url}/v1 after {len(heals)} restart(s), flags: {describe(engine)}")
        self.record(event="healthy", engine=recorded(engine), restarts=len(heals))
        if heals:
            self.say("to keep the healed flags, run:")
            self.say("  " + shlex.join(redacted(self.command(engine))), prefix="")


def supervise(opts: ServeOptions) -> int:
    sup: Supervisor | None = None

    def on_signal(signum: int, _frame: object) -> None:
        if sup is None:  # (the --python probe runs: nothing started, so stop now; run() ends the probe)
            raise KeyboardInterrupt
        sup.stopping = True

    on_stop_signals(on_signal)  # (before the probe, which may take a minute: Ctrl-C then is no traceback)
    try:
        sup = Supervisor(opts)
    except VllmUnavailable as exc:
        print(f"vllm-autoheal serve: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vllm-autoheal serve: stopped", file=sys.stderr)
        return 130
    try:
        return sup.serve()
    finally:
        sup.stop()
