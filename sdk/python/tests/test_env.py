"""OrchardEnv and run_batch against a live server (ORCHARD_URL,
ORCHARD_API_KEY): the Gymnasium loop on a browser and a desktop task, the
batch helper, and cleanup when the process gets SIGTERM.

Run from outside the source tree against the installed package
(ORCHARD_TEST_INSTALLED=1 checks that it is the installed one);
ORCHARD_TEST_DESKTOP=1 adds the desktop task."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import unittest

import orchard
from orchard import Client, OrchardEnv, OrchardError, run_batch

PAGE = "<title>Hello</title><h1>42</h1><button id=b>ok</button>"

BROWSER_TASK = {"id": "env-hello", "question": "What number does the page show?",
                "start_url": "file:///workspace/hello.html",
                "setup": {"files": [{"path": "/workspace/hello.html", "content": PAGE}],
                          "sandbox": {"block_network": True, "browser": {"viewport": {"width": 640, "height": 480}}}},
                "eval": {"type": "answer_match", "references": ["42"]}}

DESKTOP_TASK = {"id": "env-desk", "question": "Say 2.",
                "setup": {"sandbox": {"kind": "desktop", "block_network": True, "desktop": {"width": 640, "height": 480}}},
                "eval": {"type": "answer_match", "references": ["2"]}}


SHELL_TASK = {"id": "env-shell", "question": "Make /workspace/test.sh pass.",
              "setup": {"files": [{"path": "/workspace/test.sh", "content": "test \"$(cat /workspace/v 2>/dev/null)\" = 2\n"}],
                        "sandbox": {"kind": "shell", "block_network": True}},
              "eval": {"type": "exec", "command": "sh {test}", "fail_to_pass": ["/workspace/test.sh"]}}


# Prints each episode's "episode_id sandbox_id" once. Policies run in
# threads and print() writes its pieces separately, so two episodes' ids
# could interleave on one line: one locked write per line keeps them whole.
ANNOUNCE = textwrap.dedent("""
    import sys, threading
    _lock, _seen = threading.Lock(), set()
    def announce(info):
        with _lock:
            if info["episode_id"] not in _seen:
                _seen.add(info["episode_id"])
                sys.stdout.write(f'{info["episode_id"]} {info["sandbox_id"]}\\n')
                sys.stdout.flush()
""")


@unittest.skipUnless(os.environ.get("ORCHARD_URL"), "ORCHARD_URL not set: no server to test against")
class EnvTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = Client()
        cls.c.load_tasks("envtest", "\n".join(json.dumps(t) for t in (BROWSER_TASK, DESKTOP_TASK, SHELL_TASK)) + "\n")

    def test_installed(self):
        if os.environ.get("ORCHARD_TEST_INSTALLED"):
            self.assertIn("site-packages", orchard.__file__)
            self.assertTrue(os.path.exists(os.path.join(os.path.dirname(orchard.__file__), "py.typed")))

    def loop(self, env, actions):
        obs, info = env.reset(seed=1)
        self.assertIsNone(info["outcome"])
        self.assertFalse(info["env_error"])
        self.assertTrue(env.observation_space.contains(obs))
        steps = 0
        for a in actions:
            self.assertTrue(env.action_space.contains(a), a)
            obs, reward, terminated, truncated, info = env.step(a)
            steps += 1
            if terminated or truncated:
                break
        self.assertTrue(terminated, info)
        self.assertFalse(truncated)
        return reward, info, steps

    def test_browser_loop(self):
        with OrchardEnv(task_id="envtest/env-hello", max_steps=5) as env:
            reward, info, steps = self.loop(env, [{"type": "click", "selector": "#b"}, {"type": "answer", "text": "42"}])
            self.assertEqual(env.kind, "browser")
            self.assertEqual((info["outcome"], reward, info["env_error"], steps), ("success", 1.0, False, 2))
            self.assertTrue(info["recording_id"])
            # A wrong answer: the policy's failure, not the environment's.
            reward, info, _ = self.loop(env, [{"type": "answer", "text": "7"}])
            self.assertEqual((info["outcome"], reward, info["env_error"]), ("failure", 0.0, False))
            ep = info["episode_id"]
        self.assertIn(self.c.json("GET", f"/episodes/{ep}")["status"], ("finished", "aborted"))

    def test_shell_loop(self):
        with OrchardEnv(task_id="envtest/env-shell", max_steps=5) as env:
            obs, info = env.reset()
            self.assertEqual(env.kind, "shell")
            self.assertEqual(env.action_space.kind, "shell")
            obs, reward, terminated, truncated, info = env.step({"type": "exec", "command": "sh /workspace/test.sh"})
            self.assertTrue(env.observation_space.contains(obs), obs)
            self.assertEqual((obs["exit_code"], terminated, truncated), (1, False, False), obs)
            obs, _, _, _, _ = env.step({"type": "write_file", "path": "/workspace/v", "content": "2"})
            obs, _, _, _, _ = env.step({"type": "exec", "command": "sh /workspace/test.sh && echo passed"})
            self.assertEqual((obs["exit_code"], obs["stdout"]), (0, "passed\n"), obs)
            obs, reward, terminated, truncated, info = env.step({"type": "submit"})
            self.assertTrue(terminated, info)
            self.assertEqual((info["outcome"], reward, info["env_error"]), ("success", 1.0, False), info)
            # Without the fix the same task fails: the policy's failure.
            env.reset()
            _, reward, terminated, _, info = env.step({"type": "submit"})
            self.assertEqual((terminated, info["outcome"], reward, info["env_error"]), (True, "failure", 0.0, False), info)

    def test_step_limit_truncates(self):
        with OrchardEnv(task_id="envtest/env-hello", max_steps=2) as env:
            env.reset()
            truncated = False
            for _ in range(5):
                _, _, terminated, truncated, info = env.step({"type": "wait", "ms": 10})
                if terminated or truncated:
                    break
            self.assertTrue(truncated, info)
            self.assertIsNotNone(info["outcome"])

    @unittest.skipUnless(os.environ.get("ORCHARD_TEST_DESKTOP"), "no desktop on this machine")
    def test_desktop_loop(self):
        with OrchardEnv(task_id="envtest/env-desk", max_steps=5) as env:
            reward, info, _ = self.loop(env, [{"type": "mouse_move", "x": 10, "y": 10}, {"type": "answer", "text": "2"}])
            self.assertEqual(env.kind, "desktop")
            self.assertEqual(env.action_space.kind, "desktop")
            self.assertEqual((info["outcome"], reward, info["env_error"]), ("success", 1.0, False))

    def test_close_aborts(self):
        env = OrchardEnv(task_id="envtest/env-hello")
        _, info = env.reset()
        env.close()
        self.assertEqual(self.c.json("GET", f"/episodes/{info['episode_id']}")["status"], "aborted")
        self.assertSandboxGone(info["sandbox_id"])

    def test_batch(self):
        def policy(obs, info):
            return {"type": "answer", "text": "42" if info["step"] % 2 == 0 else "x"}
        trs = run_batch(policy, ["envtest/env-hello", BROWSER_TASK], parallel=2, repeat=2, max_steps=3)
        self.assertEqual(len(trs), 4)
        for tr in trs:
            self.assertIsNone(tr.error, tr)
            self.assertEqual((tr.outcome, tr.reward, tr.env_error, len(tr.steps)), ("success", 1.0, False, 1))
        self.assertEqual(len({tr.episode_id for tr in trs}), 4)

    def test_sigterm_leaves_no_sandbox(self):
        # A batch whose policy never returns; SIGTERM must abort its
        # episodes and release their sandboxes before the process dies.
        script = ANNOUNCE + textwrap.dedent("""
            import sys, time
            from orchard import run_batch
            def policy(obs, info):
                announce(info)
                time.sleep(600)
            run_batch(policy, ["envtest/env-hello"] * 2, parallel=2)
        """)
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        try:
            ids = [p.stdout.readline().split() for _ in range(2)]
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(60), -signal.SIGTERM)
        finally:
            if p.poll() is None:
                p.kill()
            p.stdout.close()
        for ep, sb in ids:
            self.assertEqual(self.c.json("GET", f"/episodes/{ep}")["status"], "aborted")
            self.assertSandboxGone(sb)

    def test_ctrl_c_leaves_no_sandbox(self):
        # Ctrl-C in a batch: the running episodes are aborted at once; the
        # policy calls in flight return into aborted episodes and end.
        script = ANNOUNCE + textwrap.dedent("""
            import sys, time
            from orchard import run_batch
            def policy(obs, info):
                announce(info)
                time.sleep(2)
                return {"type": "wait", "ms": 1}
            try:
                run_batch(policy, ["envtest/env-hello"] * 2, parallel=2)
            except KeyboardInterrupt:
                print("interrupted", flush=True)
                sys.exit(3)
        """)
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        try:
            ids = [p.stdout.readline().split() for _ in range(2)]
            p.send_signal(signal.SIGINT)
            self.assertEqual(p.wait(60), 3)
            self.assertIn("interrupted", p.stdout.read())
        finally:
            if p.poll() is None:
                p.kill()
            p.stdout.close()
        for ep, sb in ids:
            self.assertEqual(self.c.json("GET", f"/episodes/{ep}")["status"], "aborted")
            self.assertSandboxGone(sb)

    def assertSandboxGone(self, sandbox_id):
        deadline = time.monotonic() + 30
        while True:
            try:
                sb = self.c.json("GET", f"/sandboxes/{sandbox_id}")
            except OrchardError as e:
                self.assertEqual(e.status, 404, e)
                return
            if sb.get("status") in ("deleted", "terminated") or time.monotonic() > deadline:
                self.assertIn(sb.get("status"), ("deleted", "terminated"), sb)
                return
            time.sleep(0.2)


class OfflineTest(unittest.TestCase):
    """What needs no server: the Gymnasium base class when Gymnasium is
    importable, and a server that cannot be reached."""

    def test_subclasses_gymnasium_when_importable(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "gymnasium"))
            with open(os.path.join(d, "gymnasium", "__init__.py"), "w") as f:
                f.write("from . import spaces\nclass Env:\n    pass\n")
            with open(os.path.join(d, "gymnasium", "spaces.py"), "w") as f:
                f.write("class Space:\n    def __init__(self, shape=None, dtype=None, seed=None):\n        self.shape = shape\n")
            code = ("import gymnasium, orchard; "
                    "assert issubclass(orchard.OrchardEnv, gymnasium.Env); "
                    "assert isinstance(orchard.ActionSpace('shell'), gymnasium.spaces.Space); "
                    "print('ok')")
            env = dict(os.environ, PYTHONPATH=d)
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual(out.stdout.strip(), "ok", out.stderr)

    def test_unreachable_server_is_env_error(self):
        env = OrchardEnv(task_id="any", client=Client("http://127.0.0.1:9", retries=1, timeout=5))
        obs, info = env.reset()
        self.assertEqual((obs, info["outcome"], info["env_error"]), ({}, "env_error", True))
        self.assertEqual(info["attribution"]["code"], "client.unreachable")
        obs, reward, terminated, truncated, info2 = env.step({"type": "wait", "ms": 1})
        self.assertEqual((reward, terminated, truncated, info2["env_error"]), (0.0, True, False, True))
        env.close()

    def test_spaces(self):
        self.assertTrue(OrchardEnv(task_id="x", kind="shell").action_space.contains({"type": "exec", "command": "ls"}))
        self.assertFalse(OrchardEnv(task_id="x", kind="browser").action_space.contains({"type": "exec"}))
        self.assertTrue(OrchardEnv(task_id="x", kind="desktop").action_space.contains({"action": "left_click"}))
        self.assertIn("stdout", OrchardEnv(task_id="x", kind="shell").observation_space.fields)


if __name__ == "__main__":
    unittest.main()
