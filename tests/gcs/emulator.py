"""A Google Cloud Storage server on 127.0.0.1 for the tests, and what points clients at it.

  python emulator.py PORT BUCKET          # serves (in memory) until terminated
  os.environ.update(client_env(url))      # gcsfs (epath), TensorStore (Orbax), array_record

The server is the `gcp-storage-emulator` package (the GCS JSON API over HTTP) with two
changes that make it behave like GCS for several clients at once:
  * objects.move (`POST .../o/<name>/moveTo/o/<new name>`), which gcsfs's rename tries first,
    is served: the emulator answers it 501, which gcsfs retries with back-off for ~45 s before
    falling back to copy + delete. The added call is the emulator's own copy, then its delete.
  * connections are accepted by a thread each (requests are still handled one at a time):
    the emulator's single-threaded server blocks on a connection that a client opened and
    has not used yet (connection pools do that), and every other client then waits forever.
  * generation preconditions (ifGenerationMatch / ifGenerationNotMatch on uploads, reads and
    deletes: 412, or 304 for a read) and the x-goog-generation header of a read, which GCS
    has and the emulator lacks. TensorStore (Orbax) commits its OCDBT manifest by
    compare-and-swap on the generation, so without them concurrent array writes fail with
    "Malformed StorageGeneration" or overwrite each other.
"""
import functools
import http
import http.server
import sys
import threading

BUCKET = "bucket"


def client_env(url: str) -> dict[str, str]:
  """Environment variables that send every GCS client of the trainer to `url`, without
  credentials and without any request to Google's servers (each client's documented
  setting)."""
  closed = "127.0.0.1:9"  # nothing listens there: a metadata-server probe fails at once
  return {
      # gcsfs (etils.epath's gs:// backend): endpoint, anonymous, and no storage-control
      # gRPC probe for zonal / hierarchical buckets (the emulator serves JSON only).
      "STORAGE_EMULATOR_HOST": url,
      "FSSPEC_GCS_TOKEN": "anon",
      "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
      # TensorStore (Orbax's array writer): endpoint and a fixed bearer token.
      "TENSORSTORE_GCS_HTTP_URL": url,
      "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
      # array_record's reader (google-cloud-cpp): endpoint, anonymous with an emulator.
      "CLOUD_STORAGE_EMULATOR_ENDPOINT": url,
      "GCE_METADATA_HOST": closed,
      "GCE_METADATA_ROOT": closed,
      "GCE_METADATA_IP": closed,
  }


def _add_move(server_module, objects) -> None:
  def move(request, response, storage, *args, **kwargs):
    p = request.params
    try:
      dest = objects._copy(request.base_url, storage, p["bucket_name"], p["object_id"],  # pylint: disable=protected-access
                           p["bucket_name"], p["dest_object_id"])
    except objects.NotFound:
      response.status = http.HTTPStatus.NOT_FOUND
      return
    objects._delete(storage, p["bucket_name"], p["object_id"])  # pylint: disable=protected-access
    response.json(dest)

  route = (r"^/storage/v1/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/"
           r"(?P<dest_object_id>.*[^/]+)$", {"POST": move})
  server_module.HANDLERS = (route, *server_module.HANDLERS)


def _add_generations(server_module, objects) -> None:
  def current(storage, bucket, name) -> int:
    try:
      return int(storage.get_file_obj(bucket, name)["generation"])
    except objects.NotFound:
      return 0  # GCS's "does not exist"

  def failed(request, response, storage, name, read: bool) -> bool:
    """Answers 412 (or 304) when a precondition of the request does not hold."""
    q = request.query
    gen = current(storage, request.params["bucket_name"], name)
    if "ifGenerationMatch" in q and int(q["ifGenerationMatch"][0]) != gen:
      response.status = http.HTTPStatus.PRECONDITION_FAILED
      return True
    if "ifGenerationNotMatch" in q and int(q["ifGenerationNotMatch"][0]) == gen:
      response.status = (http.HTTPStatus.NOT_MODIFIED if read
                         else http.HTTPStatus.PRECONDITION_FAILED)
      return True
    return False

  def insert(request, response, storage, *args, **kwargs):
    name = (request.query.get("name") or [None])[0]
    if name is not None and failed(request, response, storage, name, read=False):
      return None
    return objects.insert(request, response, storage, *args, **kwargs)

  def download(request, response, storage, *args, **kwargs):
    name = request.params["object_id"]
    if failed(request, response, storage, name, read=True):
      return None
    gen = current(storage, request.params["bucket_name"], name)
    if gen:
      response["x-goog-generation"] = str(gen)
      response["x-goog-metageneration"] = "1"
    return objects.download(request, response, storage, *args, **kwargs)

  def get(request, response, storage, *args, **kwargs):
    if request.query.get("alt") == ["media"]:
      return download(request, response, storage, *args, **kwargs)
    if failed(request, response, storage, request.params["object_id"], read=True):
      return None
    return objects.get(request, response, storage, *args, **kwargs)

  def delete(request, response, storage, *args, **kwargs):
    if failed(request, response, storage, request.params["object_id"], read=False):
      return None
    return objects.delete(request, response, storage, *args, **kwargs)

  swap = {objects.insert: insert, objects.download: download, objects.get: get,
          objects.delete: delete}
  server_module.HANDLERS = tuple(
      (regex, {m: swap.get(f, f) for m, f in methods.items()})
      for regex, methods in server_module.HANDLERS)


def _accept_concurrently(server_module) -> None:
  one_at_a_time = threading.Lock()
  handle = server_module.Router.handle

  def locked_handle(self, method):
    with one_at_a_time:
      return handle(self, method)

  class ThreadedAPI(server_module.APIThread):
    def run(self):
      self._httpd = http.server.ThreadingHTTPServer(
          (self._host, self._port), functools.partial(server_module.RequestHandler, self._storage))
      self._httpd.daemon_threads = True
      self.is_running.set()
      self._httpd.serve_forever()

  server_module.Router.handle = locked_handle
  server_module.APIThread = ThreadedAPI


def main(port: int, bucket: str) -> None:
  import logging  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  from gcp_storage_emulator import server  # pylint: disable=g-import-not-at-top
  from gcp_storage_emulator.handlers import objects  # pylint: disable=g-import-not-at-top
  logging.basicConfig(level=logging.CRITICAL)
  _add_move(server, objects)
  _add_generations(server, objects)
  _accept_concurrently(server)
  gcs = server.create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
  gcs.run()


if __name__ == "__main__":
  main(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else BUCKET)
