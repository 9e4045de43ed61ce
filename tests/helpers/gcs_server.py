"""A GCS-API server on localhost for the gs:// tests: PyPI's gcp-storage-emulator, in its own
process, with the handlers fixed where it departs from real GCS in ways our clients rely on.

`GcsServer(scratch).start()` picks a free loopback port, starts the server (this file run as a
script), creates the bucket, and `env` holds what every client needs to reach it (gcsfs and
google-cloud-storage: STORAGE_EMULATOR_HOST; TensorStore, under Orbax: TENSORSTORE_GCS_HTTP_URL,
read at its first gs:// use, so set it before). `stop()` ends the server. Where it cannot start,
`start` raises `GcsUnavailable` with the reason.

The fixes (`_patch`, applied in the server process), each restoring what real GCS does:
1. Object listing honours `startOffset` / `endOffset`. The emulator ignores them, so
   TensorStore's delete of a key range (Orbax's `delete_existing`, max_to_keep) deleted every
   object in the bucket.
2. Media downloads carry `x-goog-generation`, `x-goog-metageneration` and
   `x-goog-stored-content-length`. Without the generation TensorStore's OCDBT reads after a
   write fail with "Malformed StorageGeneration".
3. Generation preconditions (`ifGenerationMatch`, `ifGenerationNotMatch`,
   `ifMetagenerationMatch`; 0 = "only if absent") answer 412 when they fail. The emulator
   ignores them, so a conditional create silently overwrote.
4. `moveTo` moves the object (copy, then delete the source). The emulator answers 501, and
   gcsfs retried every rename 6 times (~33 s).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

BUCKET = "bucket"


class GcsUnavailable(RuntimeError):
    """The server cannot run here; the message says why."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GcsServer:
    def __init__(self, scratch: str, bucket: str = BUCKET):
        self.scratch, self.bucket = str(scratch), bucket
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "TENSORSTORE_GCS_HTTP_URL": self.url,
            # gcsfs 2026.10 otherwise asks a TLS gRPC endpoint the bucket's type on every
            # operation, which times out after 60 s against a local server
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "FSSPEC_GCS_TOKEN": "anon",
            "FSSPEC_GCS_PROJECT": "test",
            "GOOGLE_CLOUD_PROJECT": "test",
        }

    def start(self) -> GcsServer:
        try:
            import gcp_storage_emulator  # noqa: F401
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage
        except ImportError as e:
            raise GcsUnavailable(f"{e.name} is not installed (the test extra installs it)") from e
        log = open(os.path.join(self.scratch, "server.log"), "w")
        self._proc = subprocess.Popen(
            [sys.executable, __file__, str(self.port), os.path.join(self.scratch, "data")],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(self.url + "/", timeout=1).read()
                break
            except OSError:
                if self._proc.poll() is not None or time.time() > deadline:
                    self.stop()
                    with open(os.path.join(self.scratch, "server.log")) as f:
                        why = f.read()[-1500:]
                    raise GcsUnavailable(f"the server did not answer: {why}") from None
                time.sleep(0.1)
        saved = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = self.url
        try:
            client = storage.Client(project="test", credentials=AnonymousCredentials())
            client.create_bucket(self.bucket)
        finally:
            if saved is None:
                os.environ.pop("STORAGE_EMULATOR_HOST")
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = saved
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._proc = None


# ----------------------------------------------------------------------------- the server


def _patch() -> None:
    import threading
    from http import HTTPStatus

    from gcp_storage_emulator import server
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    def query(request, name):
        values = request.query.get(name)
        return values[0] if values else None

    # 1. startOffset / endOffset
    ls, lock = objects.ls, threading.Lock()

    def ls_in_range(request, response, storage, *args, **kwargs):
        start, end = query(request, "startOffset"), query(request, "endOffset")
        if start is None and end is None:
            return ls(request, response, storage, *args, **kwargs)

        def keep(name):
            return (start is None or name >= start) and (end is None or name < end)

        with lock:  # the listing function is swapped for this one call
            listing = storage.get_file_list

            def in_range(*a, **k):
                files, prefixes = listing(*a, **k)
                return [f for f in files if keep(f["name"])], [p for p in prefixes if keep(p)]

            storage.get_file_list = in_range
            try:
                return ls(request, response, storage, *args, **kwargs)
            finally:
                del storage.get_file_list

    # 3. preconditions, checked against the object as it is now (absent: generation 0)
    def precondition_failed(request, storage, object_id) -> bool:
        if object_id is None:
            return False
        try:
            obj = storage.get_file_obj(request.params["bucket_name"], object_id)
            generation, metageneration = str(obj["generation"]), str(obj["metageneration"])
        except NotFound:
            generation, metageneration = "0", None
        match, not_match = (
            query(request, "ifGenerationMatch"),
            query(request, "ifGenerationNotMatch"),
        )
        meta_match = query(request, "ifMetagenerationMatch")
        return (
            (match is not None and match != generation)
            or (not_match is not None and not_match == generation)
            or (meta_match is not None and meta_match != metageneration)
        )

    def upload_name(request):
        name = query(request, "name")
        if name is None and isinstance(request.data, dict):
            name = (request.data.get("meta") or {}).get("name")
        return name

    def guarded(handler, name_of):
        def run(request, response, storage, *args, **kwargs):
            if precondition_failed(request, storage, name_of(request)):
                response.status = HTTPStatus.PRECONDITION_FAILED
                return None
            return handler(request, response, storage, *args, **kwargs)

        return run

    def object_id(request):
        return request.params.get("object_id")

    # 2. generation headers on media downloads
    download = objects.download

    def download_with_generation(request, response, storage, *args, **kwargs):
        try:
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
            response["x-goog-generation"] = str(obj["generation"])
            response["x-goog-metageneration"] = str(obj["metageneration"])
            response["x-goog-stored-content-length"] = str(obj["size"])
            response["x-goog-stored-content-encoding"] = "identity"
        except NotFound:
            pass
        return download(request, response, storage, *args, **kwargs)

    # 4. moveTo
    def move(request, response, storage, *args, **kwargs):
        bucket = request.params["bucket_name"]
        try:
            moved = objects._copy(request.base_url, storage, bucket, request.params["object_id"],
                                  bucket, request.params["dest_object_id"])  # fmt: skip
            objects._delete(storage, bucket, request.params["object_id"])
            response.json(moved)
        except NotFound:
            response.status = HTTPStatus.NOT_FOUND

    downloads = guarded(download_with_generation, object_id)
    objects.download = downloads  # get(alt=media) calls it by this name
    get = guarded(objects.get, object_id)
    replace = {
        ls: ls_in_range,
        download: downloads,
        objects.insert: guarded(objects.insert, upload_name),
        objects.xml_upload: guarded(objects.xml_upload, object_id),
        objects.get: get,
        objects.delete: guarded(objects.delete, object_id),
    }
    routes = []
    for prefix in (server.settings.API_ENDPOINT, ""):
        routes.append((
            rf"^{prefix}/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/"
            rf"(?P<dest_object_id>.*[^/]+)$",
            {"POST": move},
        ))  # fmt: skip
    for regex, handlers in server.HANDLERS:
        routes.append((regex, {m: replace.get(h, h) for m, h in handlers.items()}))
    server.HANDLERS = tuple(routes)


def main(port: int, data_dir: str) -> None:
    _patch()
    from gcp_storage_emulator.server import create_server

    os.makedirs(data_dir, exist_ok=True)
    create_server("127.0.0.1", port, in_memory=True, data_dir=data_dir).run()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
