import cProfile, io, os, pstats, time
import orjson
from nats.js import JetStreamContext
from services.api.main import create_app, tune_gc
from services.api.users import create_user
from tests.fixtures.api import api_client, api_settings, running_projector
from tests.fixtures.nats import RunningNats


async def test_bench(nats_server: RunningNats, database_url: str, js: JetStreamContext) -> None:
    settings = api_settings(nats_server, database_url, max_jobs_per_request=5000)
    app = create_app(settings)
    inside = [0.0]

    async def timed(scope, receive, send):
        t = time.perf_counter()
        try:
            await app(scope, receive, send)
        finally:
            inside[0] += time.perf_counter() - t

    async with api_client(app) as _:
        import httpx

        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=timed), base_url="http://api")
        h = {
            "Authorization": "Bearer " + create_user(database_url, "alice"),
            "content-type": "application/json",
        }
        async with running_projector(js, database_url):
            r = await client.post("/sites", params={"wait": "true"}, json={"name": "s1"}, headers=h)
            assert r.status_code == 201
            r = await client.post(
                "/jobs",
                params={"wait": "true"},
                json={"jobs": [{"site": "s1", "app": "a", "workdir": "w"}]},
                headers=h,
            )
        if True:
            keyed = os.environ.get("KEYED")
            bodies = [
                orjson.dumps(
                    {
                        "jobs": [
                            {
                                "site": "s1",
                                "app": "sim",
                                "workdir": f"r{r}/{i}",
                                "parameters": {"x": str(i)},
                                "tags": {"run": str(r)},
                            }
                            for i in range(5000)
                        ],
                        **({"idempotency_key": f"k{r}"} if keyed else {}),
                    }
                )
                for r in range(4)
            ]
            if os.environ.get("TUNE"):
                tune_gc()
            prof = cProfile.Profile() if os.environ.get("PROF") else None
            inside[0] = 0.0
            t = time.perf_counter()
            cpu = time.process_time()
            if prof:
                prof.enable()
            for b in bodies:
                resp = await client.post("/jobs", content=b, headers=h)
                assert resp.status_code == 202, resp.text[:500]
            if prof:
                prof.disable()
            dt = time.perf_counter() - t
            cpu = time.process_time() - cpu
            print(
                f"\n20000 jobs in {dt:.2f}s = {20000 / dt:.0f} jobs/s (in app {inside[0]:.2f}s; process CPU {cpu:.2f}s = {cpu / 20000 * 1e6:.0f} us/job)"
            )
        if prof:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
            print(s.getvalue())
