"""A Gymnasium-style environment over Orchard's episodes, and a batch
helper that runs many episodes at once.

``OrchardEnv`` is a ``gymnasium.Env`` when Gymnasium is importable and a
plain class with the same methods when it is not; either way it needs only
the standard library. One environment runs one episode at a time, on a
browser, desktop or shell task (the task decides)::

    env = OrchardEnv(task_id="bundled/shop-search")
    obs, info = env.reset()
    while True:
        obs, reward, terminated, truncated, info = env.step(policy(obs, info))
        if terminated or truncated:
            break
    if not info["env_error"]:   # the environment's fault, not the policy's
        learn(...)
    env.close()

Episodes left running — a crash, Ctrl-C, SIGTERM — are aborted, so their
sandboxes are released.
"""

import asyncio
import atexit
import concurrent.futures
import dataclasses
import os
import random
import signal
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .client import Client, Episode, OrchardError

try:  # Gymnasium is optional: subclass it when it is there.
    import gymnasium as _gym  # type: ignore[import-not-found]

    _EnvBase: Any = _gym.Env
    _SpaceBase: Any = _gym.spaces.Space
except ImportError:  # pragma: no cover - depends on the machine
    _gym = None
    _EnvBase = object
    _SpaceBase = object

__all__ = ["OrchardEnv", "ActionSpace", "ObservationSpace", "Trajectory", "Transition", "run_batch",
           "run_batch_async", "close_all"]

Action = Dict[str, Any]
Observation = Dict[str, Any]
Info = Dict[str, Any]

# ACTIONS are the action types each kind of episode takes (API.md).
ACTIONS: Dict[str, Tuple[str, ...]] = {
    "browser": ("navigate", "click", "double_click", "hover", "type", "key", "scroll", "drag", "select_option",
                "upload_file", "back", "forward", "reload", "new_tab", "switch_tab", "close_tab", "wait", "dialog",
                "answer"),
    "desktop": ("click", "double_click", "triple_click", "mouse_move", "mouse_down", "mouse_up", "drag", "scroll",
                "type", "key", "wait", "screenshot", "answer"),
    "shell": ("exec", "write_file", "apply_patch", "answer", "submit"),
}

# OBSERVATIONS describe each kind's observation (API.md).
OBSERVATIONS: Dict[str, Dict[str, str]] = {
    "browser": {"url": "str", "title": "str", "screenshot": "{format, data (base64), width, height}",
                "elements": "[{id, role, name, bbox}] set-of-marks", "axtree": "str", "tabs": "list", "frame": "int"},
    "desktop": {"screenshot": "{format, data (base64), width, height}", "cursor": "{x, y}", "frame": "int"},
    "shell": {"stdout": "str", "stderr": "str", "exit_code": "int", "duration_ms": "float",
              "stdout_truncated": "bool", "stderr_truncated": "bool"},
}

# ENDING actions end the episode: the environment finishes it (evaluates)
# instead of sending them as a step.
ENDING = ("answer", "submit")


class ActionSpace(_SpaceBase):
    """The actions of one kind of episode: JSON objects whose ``type`` is
    one of ``types``. A description, not a sampler: ``sample()`` returns a
    ``wait``/no-op action, for smoke tests only."""

    def __init__(self, kind: Optional[str]):
        self.kind = kind
        self.types: Tuple[str, ...] = ACTIONS.get(kind or "", tuple(sorted({t for v in ACTIONS.values() for t in v})))
        if _SpaceBase is not object:
            super().__init__(shape=None, dtype=None)

    def contains(self, x: Any) -> bool:
        if not isinstance(x, dict):
            return False
        # A desktop also takes Anthropic's and OpenAI's computer-use shapes.
        return x.get("type") in self.types or (self.kind == "desktop" and "action" in x)

    def sample(self, mask: Any = None, probability: Any = None) -> Action:
        if self.kind == "shell":
            return {"type": "exec", "command": "true"}
        return {"type": "wait", "ms": 100}

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"ActionSpace({self.kind or 'any'}: {', '.join(self.types)})"


class ObservationSpace(_SpaceBase):
    """The observation of one kind of episode: the JSON object the server
    answers, described field by field in ``fields``."""

    def __init__(self, kind: Optional[str]):
        self.kind = kind
        self.fields: Dict[str, str] = OBSERVATIONS.get(kind or "", {})
        if _SpaceBase is not object:
            super().__init__(shape=None, dtype=None)

    def contains(self, x: Any) -> bool:
        return isinstance(x, dict)

    def sample(self, mask: Any = None, probability: Any = None) -> Observation:
        return {}

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"ObservationSpace({self.kind or 'any'}: {', '.join(self.fields)})"


# _open holds every environment with an episode running, for close_all.
_open: "weakref.WeakSet[OrchardEnv]" = weakref.WeakSet()
_open_lock = threading.Lock()  # guards _open and _installed
_installed = False


def close_all() -> int:
    """Abort every episode an OrchardEnv of this process has running;
    returns how many. Safe from a signal handler: it uses connections of
    its own, not those a request in flight may hold."""
    with _open_lock:
        envs = list(_open)
    n = 0
    for env in envs:
        if env._abort_quietly(fresh=True):
            n += 1
    return n


def _on_sigterm(signum: int, frame: Any) -> None:
    close_all()
    # Then die of SIGTERM as the process would have without us, or run the
    # handler that was there before.
    prev = _previous.get(signum, signal.SIG_DFL)
    if callable(prev):
        prev(signum, frame)
        return
    if prev == signal.SIG_IGN:
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


_previous: Dict[int, Any] = {}


def _install_cleanup() -> None:
    """Abort running episodes at exit and on SIGTERM (once per process,
    only from the main thread, where Python lets handlers be set)."""
    global _installed
    with _open_lock:
        if _installed:
            return
        _installed = True
    atexit.register(close_all)
    if threading.current_thread() is threading.main_thread():
        try:
            _previous[signal.SIGTERM] = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):  # not settable here (embedded interpreters)
            pass


class OrchardEnv(_EnvBase):
    """One Orchard episode at a time behind the Gymnasium interface.

    ``task_id`` names a loaded task (``"suite/id"`` or ``"id"``), ``task``
    is an inline task; ``tasks`` is a list of task ids from which ``reset``
    picks one (with ``seed``, reproducibly). ``options`` of ``reset`` may
    name ``task_id`` or ``task`` for that episode. ``sandbox``, ``observe``,
    ``max_steps``, ``step_timeout_ms`` and ``record`` are POST /episodes'
    fields.

    ``step`` returns ``reward`` 0.0 until the episode ends, then the
    evaluator's reward. An ``answer`` action (``{"type": "answer", "text":
    ...}``) or ``submit`` ends the episode and evaluates it; so does the
    server (step limit, deadline, an environment fault). ``terminated`` is
    true when the episode ended by an answer, a submit or a fault;
    ``truncated`` when it ran out of steps or time. ``info`` always holds
    ``episode_id``, ``sandbox_id``, ``kind``, ``step``, ``outcome``
    (``success``, ``failure``, ``env_error``; None while running),
    ``attribution`` (the fault that ended an env_error episode),
    ``env_error`` (bool: drop this episode from training), ``error`` (the
    step's classified error) and, once finished, ``evaluation`` and
    ``recording_id``.
    """

    metadata: Dict[str, Any] = {"render_modes": []}
    render_mode = None

    def __init__(self, task_id: Optional[str] = None, task: Optional[Dict[str, Any]] = None, *,
                 tasks: Optional[Sequence[str]] = None, client: Optional[Client] = None,
                 sandbox: Optional[Dict[str, Any]] = None, observe: Optional[Dict[str, Any]] = None,
                 max_steps: Optional[int] = None, step_timeout_ms: Optional[int] = None,
                 record: Optional[bool] = None, kind: Optional[str] = None):
        self.client = client or Client()
        self.task_id = task_id
        self.task = task
        self.tasks = list(tasks or [])
        self.sandbox = sandbox
        self.observe = observe
        self.max_steps = max_steps
        self.step_timeout_ms = step_timeout_ms
        self.record = record
        self.kind = kind
        self.action_space = ActionSpace(kind)
        self.observation_space = ObservationSpace(kind)
        self.episode: Optional[Episode] = None
        self.result: Optional[Dict[str, Any]] = None
        self._rng = random.Random()
        self._steps = 0
        self._ids: Tuple[Optional[str], Optional[str]] = (None, None)  # the last episode's and its sandbox's
        self._start_failed: Optional[Info] = None  # the info of a reset that could not start an episode
        self._lock = threading.Lock()  # guards episode against close_all from a signal handler
        _install_cleanup()

    # -- the Gymnasium interface --

    def reset(self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None
              ) -> Tuple[Observation, Info]:
        """Abort the running episode, if any, and start a new one; returns
        the first observation and info."""
        if seed is not None:
            self._rng.seed(seed)
        self._abort_quietly()
        self._start_failed = None
        opts = dict(options or {})
        task_id, task = opts.get("task_id"), opts.get("task")
        if task_id is None and task is None:
            task_id, task = self.task_id, self.task
            if self.tasks:
                task_id, task = self._rng.choice(self.tasks), None
        if task_id is None and task is None:
            raise ValueError("OrchardEnv.reset: no task (give task_id, task or tasks, or options={'task_id': ...})")
        try:
            ep = self.client.start_episode(task_id=task_id, task=task, sandbox=opts.get("sandbox", self.sandbox),
                                           observe=opts.get("observe", self.observe),
                                           max_steps=opts.get("max_steps", self.max_steps),
                                           step_timeout_ms=self.step_timeout_ms, record=self.record)
        except OrchardError as e:
            if e.status and e.status < 500 and e.category != "capacity":
                raise  # the caller's mistake: a bad task, a bad key
            # The environment could not start the episode: an env_error
            # episode of no steps, so that a trainer loop goes on.
            self.episode, self.result, self._steps, self._ids = None, None, 0, (None, None)
            info = self._info(None, {"outcome": "env_error", "attribution": _fault(e)})
            info["error"] = _fault(e)
            self._start_failed = info
            return {}, info
        with self._lock:
            self.episode, self.result, self._steps = ep, None, 0
            self._ids = (ep.id, ep.sandbox_id)
            with _open_lock:
                _open.add(self)
        try:
            kind = ep.state().get("kind")
        except OrchardError:
            kind = self.kind
        if kind and kind != self.kind:
            self.kind = kind
            self.action_space = ActionSpace(kind)
            self.observation_space = ObservationSpace(kind)
        return ep.observation or {}, self._info(None, None)

    def step(self, action: Action) -> Tuple[Observation, float, bool, bool, Info]:
        """One action; the episode is finished (evaluated) when it ends."""
        ep = self.episode
        if ep is None:
            if self._start_failed is not None:
                # reset could not start an episode: it ends here, env_error.
                return {}, 0.0, True, False, self._start_failed
            raise RuntimeError("OrchardEnv.step: no episode running; call reset()")
        if not isinstance(action, dict):
            raise TypeError(f"OrchardEnv.step: action must be a dict, not {type(action).__name__}")
        typ = action.get("type")
        try:
            if typ in ENDING:
                self._steps += 1
                res = self._finish(action.get("text") if typ == "answer" else None)
                return ep.observation or {}, _reward(res), True, False, self._info(None, res)
            r = ep.step(action)
        except OrchardError as e:
            if e.status and e.status < 500 and e.code != "episode.done":
                raise  # a malformed action is the caller's to fix
            res = self._finish_after_error(e)
            info = self._info(None, res)
            info["error"] = info["error"] or _fault(e)
            return ep.observation or {}, _reward(res), True, False, info
        except BaseException:
            # Ctrl-C or a crash mid-step: the episode will not go on.
            self._abort_quietly()
            raise
        self._steps += 1
        obs = r.get("observation") or {}
        step_info = r.get("info") or {}
        if not r.get("done"):
            return obs, 0.0, False, False, self._info(step_info, None)
        res = self._finish(None)
        ended_by_fault = bool(step_info.get("error")) or res.get("outcome") == "env_error"
        return obs, _reward(res), ended_by_fault, not ended_by_fault, self._info(step_info, res)

    def close(self) -> None:
        """Abort the running episode, if any (its sandbox is released), and
        close the client's connections."""
        self._abort_quietly()
        self.client.close()

    def render(self) -> None:
        return None

    def __enter__(self) -> "OrchardEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- inside --

    def _finish(self, answer: Optional[str]) -> Dict[str, Any]:
        ep = self.episode
        assert ep is not None
        try:
            res = ep.finish(answer)
        finally:
            with self._lock:
                self.episode = None
                with _open_lock:
                    _open.discard(self)
        self.result = res
        return res

    def _finish_after_error(self, err: OrchardError) -> Dict[str, Any]:
        """End the episode after a step or finish failed: finish it if it
        still runs, else (or if that fails too) call it env_error."""
        if self.episode is not None:
            try:
                return self._finish(None)
            except OrchardError as e:
                err = e
            self._abort_quietly()
        self.result = {"outcome": "env_error", "attribution": _fault(err), "reward": None}
        return self.result

    def _abort_quietly(self, fresh: bool = False) -> bool:
        """Abort the running episode; True if there was one. fresh: over
        a new client (from a signal handler)."""
        with self._lock:
            ep, self.episode = self.episode, None
            with _open_lock:
                _open.discard(self)
        if ep is None:
            return False
        c = Client(self.client.base_url, self.client.api_key, timeout=30, retries=2) if fresh else self.client
        try:
            c.json("DELETE", f"/episodes/{ep.id}")
        except OrchardError:
            pass
        finally:
            if fresh:
                c.close()
        return True

    def _info(self, step_info: Optional[Dict[str, Any]], result: Optional[Dict[str, Any]]) -> Info:
        res = result or {}
        info: Info = {
            "episode_id": self._ids[0],
            "sandbox_id": self._ids[1],
            "kind": self.kind,
            "step": (step_info or {}).get("step", self._steps),
            "outcome": res.get("outcome"),
            "attribution": res.get("attribution"),
            "env_error": res.get("outcome") == "env_error",
            "error": (step_info or {}).get("error"),
        }
        if result is not None:
            info["evaluation"] = res.get("evaluation")
            info["recording_id"] = res.get("recording_id")
            info["answer"] = res.get("answer")
        return info


def _reward(res: Dict[str, Any]) -> float:
    r = res.get("reward")
    return float(r) if r is not None else 0.0


def _fault(e: OrchardError) -> Dict[str, Any]:
    return {"category": e.category or "unavailable", "source": e.source or "platform", "code": e.code,
            "message": e.message, "retryable": e.retryable}


# -- many episodes at once --

@dataclasses.dataclass
class Transition:
    """One step of a trajectory: the action and what followed it."""
    action: Action
    observation: Observation
    reward: float
    terminated: bool
    truncated: bool
    info: Info


@dataclasses.dataclass
class Trajectory:
    """One episode run by run_batch: the first observation, every step,
    and how it ended. ``error`` is set when the rollout itself failed (the
    policy raised, the task was refused); ``env_error`` when the
    environment ended it — drop both from training."""
    task_id: Optional[str]
    episode_id: Optional[str] = None
    observation: Observation = dataclasses.field(default_factory=dict)
    steps: List[Transition] = dataclasses.field(default_factory=list)
    outcome: Optional[str] = None
    reward: float = 0.0
    attribution: Optional[Dict[str, Any]] = None
    env_error: bool = False
    recording_id: Optional[str] = None
    error: Optional[str] = None


Policy = Callable[[Observation, Info], Action]
TaskSpec = Union[str, Dict[str, Any]]


def _rollout(make_env: Callable[[], OrchardEnv], task: TaskSpec, policy: Policy, max_steps: int,
             stop: threading.Event) -> Trajectory:
    opts: Dict[str, Any] = {"task": task} if isinstance(task, dict) else {"task_id": task}
    tr = Trajectory(task_id=task.get("id") if isinstance(task, dict) else task)
    env = make_env()
    try:
        obs, info = env.reset(options=opts)
        tr.observation, tr.episode_id = obs, info.get("episode_id")
        if info.get("outcome") is None:
            for _ in range(max_steps):
                if stop.is_set():
                    tr.error = "stopped"
                    return tr
                action = policy(obs, info)
                obs, reward, term, trunc, info = env.step(action)
                tr.steps.append(Transition(action, obs, reward, term, trunc, info))
                if term or trunc:
                    break
            else:
                obs, reward, term, trunc, info = env.step({"type": "submit"})
        tr.outcome, tr.attribution = info.get("outcome"), info.get("attribution")
        tr.env_error, tr.recording_id = bool(info.get("env_error")), info.get("recording_id")
        tr.reward = _reward(env.result or {})
    except Exception as e:  # the rollout failed; the batch goes on
        tr.error = f"{type(e).__name__}: {e}"
    finally:
        env.close()
    return tr


async def run_batch_async(policy: Policy, tasks: Sequence[TaskSpec], *, parallel: int = 4, repeat: int = 1,
                          max_steps: int = 100, client: Optional[Client] = None,
                          **env_kwargs: Any) -> List[Trajectory]:
    """Run an episode per task (``repeat`` times each), at most ``parallel``
    at once, each on a thread of its own with its own OrchardEnv; returns
    the trajectories in task order. ``policy(observation, info)`` returns
    the next action (called on the episode's thread). Cancelling the
    coroutine, Ctrl-C or SIGTERM aborts the running episodes."""
    if parallel < 1:
        raise ValueError("parallel must be >= 1")
    _install_cleanup()
    base = client or Client()
    work = [t for t in tasks for _ in range(repeat)]

    def make_env() -> OrchardEnv:
        # An environment per rollout, over a client of its own: a client's
        # connections are per thread anyway, and closing one closes them.
        return OrchardEnv(client=Client(base.base_url, base.api_key, timeout=base.timeout), **env_kwargs)

    stop = threading.Event()
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(parallel, "orchard-batch")
    try:
        futs = [loop.run_in_executor(pool, _rollout, make_env, t, policy, max_steps, stop) for t in work]
        return list(await asyncio.gather(*futs))
    except BaseException:
        stop.set()
        close_all()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def run_batch(policy: Policy, tasks: Sequence[TaskSpec], **kwargs: Any) -> List[Trajectory]:
    """run_batch_async from blocking code."""
    try:
        return asyncio.run(run_batch_async(policy, tasks, **kwargs))
    except KeyboardInterrupt:
        close_all()
        raise
