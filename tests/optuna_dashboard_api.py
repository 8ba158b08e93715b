"""optuna-dashboard's own API over a study's storage, for the interop checks.

`study_detail(url, name)` serves the storage at `url` with optuna-dashboard's
WSGI app on a free local port, and returns the study `name`'s detail as its
web page reads it (`/api/studies/ID`), with the dashboard's version; or None
when optuna-dashboard is not installed (an error with
SALUS_TUNE_REQUIRE_OPTUNA=1, as CI sets).
"""
import json
import os
import threading
import urllib.request
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def study_detail(url, name):
    try:
        import optuna_dashboard
    except ImportError:
        if os.environ.get("SALUS_TUNE_REQUIRE_OPTUNA") == "1":
            raise
        print("optuna-dashboard not installed: its check skipped")
        return None
    server = make_server("127.0.0.1", 0, optuna_dashboard.wsgi(optuna.storages.RDBStorage(url)),
                         handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api = f"http://127.0.0.1:{server.server_port}/api/studies"
        summaries = json.load(urllib.request.urlopen(api))["study_summaries"]
        mine = [s for s in summaries if s["study_name"] == name]
        assert len(mine) == 1, summaries
        detail = json.load(urllib.request.urlopen(f"{api}/{mine[0]['study_id']}?after=0"))
        return detail, optuna_dashboard.__version__
    finally:
        server.shutdown()
