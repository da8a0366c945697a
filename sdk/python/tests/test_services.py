"""Service endpoints against a live Orchard server (ORCHARD_URL,
ORCHARD_API_KEY; server/services_test.go starts one and runs this): this
client's expose_service / list_services / revoke_service, and the same
calls as Orchard Env's SDK makes them (its request bodies, sent with
requests when it is installed)."""

import asyncio
import json
import os
import sys
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from orchard import AsyncClient, Client, OrchardError  # noqa: E402

START = ("mkdir -p /tmp/www && echo ok > /tmp/www/health && "
         "(cd /tmp/www && python3 -m http.server {port} --bind 127.0.0.1 >/tmp/http.log 2>&1 &); true")


def get(url):
    """GET without an API key: (status, body)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@unittest.skipUnless(os.environ.get("ORCHARD_URL"), "ORCHARD_URL names no server")
class Services(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = Client()

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def test_expose_list_revoke(self):
        with self.c.create_sandbox(block_network=True) as sb:
            self.assertEqual(sb.exec(START.format(port=8000))["exit_code"], 0)
            ep = sb.expose_service(8000, wait_ready=True, ready_timeout=30)
            self.assertEqual((ep.sandbox_id, ep.port), (sb.id, 8000))
            self.assertTrue(ep.ws_url.startswith("ws://") and ep.ws_url[2:] == ep.url[4:])
            self.assertNotIn(ep.url, repr(ep))
            self.assertEqual(get(ep.url + "/health"), (200, b"ok\n"))
            self.assertEqual(sb.list_services(), [8000])
            with self.assertRaises(OrchardError) as e:
                sb.expose_service(7070)
            self.assertEqual((e.exception.status, e.exception.code), (400, "service.port_invalid"))
            with self.assertRaises(OrchardError) as e:
                sb.expose_service(8009, wait_ready=True, ready_timeout=1)
            self.assertEqual((e.exception.status, e.exception.code), (408, "service.not_ready"))
            self.assertEqual(sb.revoke_service(8000)["status"], "revoked")
            self.assertEqual(get(ep.url + "/health")[0], 403)
            self.assertEqual(sb.list_services(), [])

    def test_async(self):
        async def run():
            ac = AsyncClient()
            try:
                async with await ac.create_sandbox(block_network=True) as sb:
                    await sb.exec(START.format(port=8002))
                    ep = await sb.expose_service(8002, wait_ready=True, ready_timeout=30)
                    self.assertEqual(get(ep.url + "/health"), (200, b"ok\n"))
                    self.assertEqual(await sb.list_services(), [8002])
                    await sb.revoke_service(8002)
            finally:
                ac.close()
        asyncio.run(run())

    def test_orchard_env_sdk_calls(self):
        """The requests Orchard Env's SDK sends for expose_service,
        list_services and revoke_service, and what it reads back."""
        try:
            import requests
        except ImportError:
            self.skipTest("python3-requests is not installed")
        base, key = os.environ["ORCHARD_URL"].rstrip("/"), os.environ["ORCHARD_API_KEY"]
        s = requests.Session()
        s.headers["X-API-Key"] = key
        r = s.post(base + "/sandboxes", json={"image": "host", "block_network": True})
        r.raise_for_status()
        sid = r.json()["sandbox_id"]
        try:
            s.get(f"{base}/sandboxes/{sid}/wait", params={"timeout": 120}).raise_for_status()
            r = s.post(f"{base}/sandboxes/{sid}/exec", json={"command": START.format(port=8003), "timeout_seconds": None,
                                                              "cwd": None, "env": None, "login_shell": False, "wait": True})
            r.raise_for_status()
            r = s.post(f"{base}/sandboxes/{sid}/services",
                       json={"port": 8003, "wait_ready": True, "health_path": "/health", "ready_timeout": 30, "ttl_seconds": 300})
            r.raise_for_status()
            data = r.json()
            for k in ("sandbox_id", "port", "url", "expires_at"):
                self.assertIn(k, data)
            ws_url = data["url"].replace("http://", "ws://", 1).replace("https://", "wss://", 1)
            self.assertTrue(ws_url.startswith("ws"))
            self.assertEqual(requests.get(data["url"] + "/health").text, "ok\n")
            r = s.get(f"{base}/sandboxes/{sid}/services")
            r.raise_for_status()
            self.assertEqual(r.json().get("ports", []), [8003])
            s.delete(f"{base}/sandboxes/{sid}/services/8003").raise_for_status()
            self.assertEqual(requests.get(data["url"] + "/health").status_code, 403)
            r = s.delete(f"{base}/sandboxes/{sid}/services/8003")
            self.assertEqual(r.status_code, 404)
            self.assertEqual(json.loads(r.text)["detail"], f"Port 8003 is not exposed for sandbox {sid}")
        finally:
            s.delete(f"{base}/sandboxes/{sid}")
