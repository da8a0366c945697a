"""The client against a live Orchard server: ORCHARD_URL and ORCHARD_API_KEY
name it (server/python_sdk_test.go starts one and runs this). Real
sandboxes, a real browser; ORCHARD_TEST_DESKTOP=1 adds a desktop."""

import asyncio
import json
import os
import time
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from orchard import AsyncClient, Client, OrchardError, screenshot_bytes  # noqa: E402

PAGE = """<!doctype html><html><head><title>Shop</title></head><body style="margin:0">
<input id="q" style="position:absolute;left:20px;top:80px;width:300px;height:30px">
<button id="go" style="position:absolute;left:340px;top:80px;width:100px;height:30px"
  onclick="document.getElementById('r').textContent='3 results for '+document.getElementById('q').value">Search</button>
<p id="r" style="position:absolute;left:20px;top:140px">no search yet</p>
</body></html>"""

PNG = b"\x89PNG\r\n\x1a\n"


@unittest.skipUnless(os.environ.get("ORCHARD_URL"), "ORCHARD_URL names no server")
class Live(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = Client()

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def test_errors_are_classified(self):
        with self.assertRaises(OrchardError) as e, Client(api_key="not-the-key") as wrong:
            wrong.sandboxes()
        self.assertEqual((e.exception.status, e.exception.code, e.exception.source), (403, "client.invalid_api_key", "client"))
        with self.assertRaises(OrchardError) as e:
            self.c.sandbox("nosuchid")
        self.assertEqual((e.exception.status, e.exception.code), (404, "sandbox.not_found"))
        with self.assertRaises(OrchardError) as e:
            Client(base_url="http://127.0.0.1:1", retries=1).health()
        self.assertEqual((e.exception.status, e.exception.code), (0, "client.unreachable"))

    def test_keep_alive(self):
        c = Client()
        self.addCleanup(c.close)
        c.health()
        conn = c._local.conn
        for _ in range(20):
            c.health()
        self.assertIs(c._local.conn, conn, "a new connection for every request")
        # A connection the server closed is replaced without a trace, for
        # a request that changes nothing and for one that was never sent.
        conn.sock.close()
        self.assertEqual(c.health()["status"], "healthy")
        self.assertIsNot(c._local.conn, conn)
        c._local.conn.sock.close()
        with c.create_sandbox() as sb:
            self.assertEqual(sb.exec("echo once")["stdout"], "once\n")

    def test_shell(self):
        with self.c.create_sandbox(labels={"suite": "python"}) as sb:
            self.assertEqual(sb.status, "ready")
            self.assertIn(sb.id, [s.id for s in self.c.sandboxes(labels={"suite": "python"})])
            job = sb.exec("echo hi; echo err >&2; exit 3")
            self.assertEqual((job["status"], job["exit_code"], job["stdout"], job["stderr"]), ("failed", 3, "hi\n", "err\n"))
            blob = bytes(range(256)) * 4
            sb.upload("/workspace/d/blob.bin", blob)
            self.assertEqual(sb.download("/workspace/d/blob.bin"), blob)
            names = [f["name"] for f in sb.list_files("/workspace/d")["files"]]
            self.assertEqual(names, ["blob.bin"])
        with self.assertRaises(OrchardError) as e:
            sb.refresh()
        self.assertEqual(e.exception.status, 404)

    def test_pool(self):
        # A memory no other test asks for: their creates must not match it.
        pool = self.c.create_pool("py-pool", 1, memory="300Mi")
        self.addCleanup(self.c.delete_pool, "py-pool")
        self.assertEqual((pool["name"], pool["size"], pool["max"]), ("py-pool", 1, 1))
        deadline = time.monotonic() + 60
        while self.c.pool("py-pool")["ready"] < 1:
            self.assertLess(time.monotonic(), deadline, self.c.pool("py-pool"))
            time.sleep(0.05)
        with self.c.create_sandbox(memory="300Mi", pool="py-pool", labels={"from": "pool"}) as sb:
            self.assertEqual(sb.status, "ready")
            self.assertEqual(sb.exec("echo warm")["stdout"], "warm\n")
            self.assertEqual(sb.refresh().info["labels"], {"from": "pool"})
        self.assertEqual([p["claims"] for p in self.c.list_pools() if p["name"] == "py-pool"], [1])
        with self.assertRaises(OrchardError) as e:
            self.c.create_sandbox(memory="400Mi", pool="py-pool")
        self.assertEqual((e.exception.status, e.exception.code), (422, "pool.spec_mismatch"))
        with self.assertRaises(OrchardError) as e:
            self.c.pool("no-such-pool")
        self.assertEqual((e.exception.status, e.exception.code), (404, "pool.not_found"))

    def test_pause_resume(self):
        with self.c.create_sandbox() as sb:
            sb.exec("echo kept > /tmp/f")
            self.assertEqual(sb.pause().status, "paused")
            with self.assertRaises(OrchardError) as e:
                sb.exec("true")
            self.assertEqual((e.exception.status, e.exception.code), (409, "sandbox.paused"))
            self.assertEqual(sb.resume().status, "ready")
            self.assertEqual(sb.exec("cat /tmp/f")["stdout"], "kept\n")

    def test_snapshot_fork(self):
        with self.c.create_sandbox() as sb:
            sb.exec("echo one > /workspace/f")
            snap = sb.snapshot(labels={"k": "v"})
            self.assertEqual((snap["sandbox_id"], snap["labels"]), (sb.id, {"k": "v"}))
            sb.exec("echo two > /workspace/f")
            with self.c.create_sandbox(snapshot=snap["snapshot_id"]) as restored:
                self.assertEqual(restored.exec("cat /workspace/f")["stdout"], "one\n")
            branches = sb.fork(2)
            try:
                self.assertEqual([b.info["fork_of"] for b in branches], [sb.id, sb.id])
                branches[0].exec("echo mine > /workspace/f")
                self.assertEqual(branches[1].exec("cat /workspace/f")["stdout"], "two\n")
            finally:
                for b in branches:
                    b.delete()
            self.assertIn(snap["snapshot_id"], [s["snapshot_id"] for s in self.c.snapshots()])
            self.c.delete_snapshot(snap["snapshot_id"])
            with self.assertRaises(OrchardError) as e:
                self.c.snapshot(snap["snapshot_id"])
            self.assertEqual((e.exception.status, e.exception.code), (404, "snapshot.not_found"))

    def test_browser(self):
        with self.c.create_sandbox(kind="browser", browser={"viewport": {"width": 800, "height": 600}}) as sb:
            sb.upload("/workspace/page.html", PAGE)
            r = sb.browser.act({"type": "navigate", "url": "file:///workspace/page.html"},
                               observe={"screenshot": "jpeg", "som": True})
            self.assertTrue(r["ok"], r)
            obs = r["observation"]
            self.assertEqual(obs["title"], "Shop")
            self.assertTrue(screenshot_bytes(obs).startswith(b"\xff\xd8"))
            button = [e for e in obs["elements"] if e["role"] == "button"]
            self.assertEqual(len(button), 1, obs["elements"])
            r = sb.browser.act([{"type": "click", "selector": "#q"}, {"type": "type", "text": "lamp"},
                                {"type": "click", "element": button[0]["id"]}],
                               frame=obs["frame"], observe={"screenshot": "none", "text": True})
            self.assertTrue(r["ok"], r)
            self.assertIn("3 results for lamp", r["observation"]["text"])
            self.assertEqual(sb.browser.evaluate("document.getElementById('r').textContent"), "3 results for lamp")
            # A failing action is a result, not an exception.
            r = sb.browser.act({"type": "click", "selector": "#nope"})
            self.assertFalse(r["ok"])
            self.assertEqual(r["results"][0]["error"]["code"], "action.no_such_element")

            img = sb.browser.screenshot()
            self.assertTrue(img.data.startswith(PNG))
            self.assertEqual((img.width, img.height, img.scale), (800, 600, 1.0))
            half = sb.browser.screenshot(format="jpeg", scale=0.5)
            self.assertEqual((half.width, half.scale), (400, 0.5))
            self.assertGreater(half.frame, img.frame)
            self.assertEqual(len(sb.browser.tabs()), 1)
            self.assertIn("elements", sb.browser.observe(screenshot="none", som=True))

    def test_episode(self):
        task = {"id": "py-search", "question": "How many results for lamp?", "start_url": "file:///workspace/shop.html",
                "setup": {"files": [{"path": "/workspace/shop.html", "content": PAGE}],
                          "sandbox": {"block_network": True, "browser": {"viewport": {"width": 800, "height": 600}}}},
                "eval": {"type": "answer_match", "mode": "numeric", "references": ["3"]}}
        loaded = self.c.load_tasks("python", json.dumps(task) + "\n")
        self.assertEqual(loaded["tasks"], 1)
        self.assertIn("python", [s["name"] for s in self.c.tasks()])
        ep = self.c.start_episode(task_id="py-search", max_steps=10)
        self.assertEqual(ep.observation["title"], "Shop")
        for a in ({"type": "click", "selector": "#q"}, {"type": "type", "text": "lamp"}, {"type": "click", "selector": "#go"}):
            r = ep.step(a)
            self.assertFalse(r["done"], r)
        res = ep.finish("There are 3.")
        self.assertEqual((res["outcome"], res["reward"]), ("success", 1.0))
        self.assertIn(ep.id, [e["episode_id"] for e in self.c.episodes()])
        rec = res.get("recording_id")
        self.assertTrue(rec, res)
        lines = [json.loads(line) for line in self.c.export_recording(rec, "jsonl").decode().splitlines()]
        # The manifest, then the first observation and one line per step.
        self.assertEqual(lines[0]["type"], "manifest")
        self.assertEqual((lines[0]["manifest"]["steps"], len(lines) - 1), (4, 4))

    def test_episode_fork(self):
        # A bundled task: branches at step 3 (on the bottle's page), each
        # rolling out the rest of the script or stopping.
        sites = os.path.join(os.path.dirname(__file__), "..", "..", "..", "sites")
        with open(os.path.join(sites, "suite.jsonl"), "rb") as f:
            self.c.load_tasks("bundled", f.read(), name="suite.jsonl")
        with open(os.path.join(sites, "scripts.json")) as f:
            script = json.load(f)["shop-add-two-bottles"]
        ep = self.c.start_episode(task_id="bundled/shop-add-two-bottles", max_steps=10, record=False)
        for a in script[:3]:
            self.assertFalse(ep.step(a)["done"])
        rest = script[3:]

        def scripted():
            todo = list(rest)
            return lambda obs: todo.pop(0) if todo else None

        with self.assertRaises(ValueError):
            self.c.value_of_step(ep.id, 2, policy_factory=scripted, k=2)
        v = self.c.value_of_step(ep.id, 2, policy_factory=scripted, k=3, max_steps=5)
        self.assertEqual((v["rewards"], v["value"], v["outcomes"]), ([1.0, 1.0], 1.0, ["success", "success"]), v)
        # A policy that stops at once: the branch fails where the parent is.
        stop = self.c.value_of_step(ep.id, 1, lambda obs: None)
        self.assertEqual((stop["rewards"], stop["value"]), ([0.0], 0.0), stop)
        branches = ep.fork(2)
        self.assertEqual([b.state()["branch_step"] for b in branches], [3, 3])
        self.assertTrue(branches[0].observation["url"].endswith("product.html?id=9"), branches[0].observation.get("url"))
        tree = self.c.episode_tree(branches[1].id)
        self.assertEqual(tree["root"], ep.id)
        kids = tree["episodes"][0]["children"]
        self.assertEqual(len(kids), 5)
        self.assertEqual(kids[-2:], [b.id for b in branches])
        self.assertEqual({e["episode_id"]: e["parent"] for e in tree["episodes"][1:]}, {i: ep.id for i in kids})
        for b in branches:
            b.abort()
        self.assertEqual(ep.finish()["outcome"], "failure")
        with self.assertRaises(OrchardError) as e:
            ep.fork(1)
        self.assertEqual((e.exception.status, e.exception.category), (409, "conflict"))

    def test_async_sandboxes_at_once(self):
        async def rollout(c, n):
            async with await c.create_sandbox(kind="browser", labels={"rollout": str(n)}) as sb:
                r = await sb.browser.act({"type": "navigate", "url": f"about:blank#{n}"}, observe={"screenshot": "none"})
                job = await sb.exec(f"echo {n}")
                return r["observation"]["url"], job["stdout"], sb.id

        async def main():
            c = AsyncClient(workers=8)
            try:
                with self.assertRaises(OrchardError):
                    await c.sandbox("nosuchid")
                return await asyncio.gather(*(rollout(c, n) for n in range(3)))
            finally:
                c.close()

        t0 = time.monotonic()
        got = asyncio.run(main())
        self.assertEqual([(u, o) for u, o, _ in got], [(f"about:blank#{n}", f"{n}\n") for n in range(3)])
        left = [s.id for s in self.c.sandboxes(kind="browser")]
        self.assertFalse(set(left) & {i for _, _, i in got}, "sandboxes left after their async with")
        self.assertLess(time.monotonic() - t0, 120)

    def test_exec_waits_for_a_queued_job(self):
        # Jobs of one sandbox run one at a time; the server's own wait for
        # an exec ends at its timeout + 30 s, queue time included. exec
        # still returns the finished job.
        with self.c.create_sandbox() as sb:
            long = threading.Thread(target=sb.exec, args=("sleep 34",))
            long.start()
            time.sleep(1)
            job = sb.exec("echo hi", timeout=1)
            long.join()
            self.assertEqual((job["status"], job.get("exit_code"), job.get("stdout")), ("succeeded", 0, "hi\n"))

    def test_async_cancelled_create_leaves_nothing(self):
        # A create cancelled after the server accepted it (a wait_for that
        # gave up) goes on in its worker thread; what it made is deleted.
        labels = {"suite": "py-cancel"}

        def listed():
            return [s.id for s in self.c.sandboxes(labels=labels)]

        async def main():
            c = AsyncClient(workers=2)
            try:
                for _ in range(10):
                    task = asyncio.ensure_future(c.create_sandbox(kind="browser", labels=labels))
                    while not task.done() and not await asyncio.to_thread(listed):
                        await asyncio.sleep(0.002)
                    if not task.done():
                        task.cancel()  # accepted, not yet ready
                        with self.assertRaises(asyncio.CancelledError):
                            await task
                        return True
                    await (await task).delete()  # ready before it was seen: again
                return False
            finally:
                c.close()  # after the calls in flight

        cancelled = asyncio.run(main())
        self.assertTrue(cancelled, "no create was caught between its acceptance and readiness")
        deadline = time.monotonic() + 30
        while listed() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = listed()
        for i in left:
            self.c.sandbox(i).delete()
        self.assertEqual(left, [], "a cancelled create_sandbox left its sandbox behind")

    @unittest.skipUnless(os.environ.get("ORCHARD_TEST_DESKTOP"), "no desktop on this machine")
    def test_desktop(self):
        with self.c.create_sandbox(kind="desktop", desktop={"width": 800, "height": 600}) as sb:
            r = sb.desktop.act([{"action": "mouse_move", "coordinate": [120, 90]}])
            self.assertTrue(r["ok"], r)
            cur = sb.desktop.cursor()
            self.assertEqual((cur["screen_x"], cur["screen_y"]), (120, 90))
            shot = sb.desktop.screenshot(format="jpeg", width=400)
            self.assertTrue(shot.data.startswith(b"\xff\xd8"))
            self.assertEqual((shot.scale, shot.frame > 0), (0.5, True))


if __name__ == "__main__":
    unittest.main()
