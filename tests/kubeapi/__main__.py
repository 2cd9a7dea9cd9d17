"""Run the stand-in by hand: ``PYTHONPATH=tests python -m kubeapi --kubeconfig /tmp/kubeapi.json``.

Then ``KUBECONFIG=/tmp/kubeapi.json`` for the ``kubernetes`` client, or
``AIRFLOW_CONN_KUBERNETES_DEFAULT`` as printed. Stops on Ctrl-C (pods are killed).
"""

from __future__ import annotations

import argparse
import time

from kubeapi.server import KubeAPIServer


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kubeapi", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--kubeconfig", required=True, help="where to write the kubeconfig")
    args = parser.parse_args()
    with KubeAPIServer().start(args.port) as api:
        path = api.write_kubeconfig(args.kubeconfig)
        print(f"kubeapi stand-in on {api.url}; kubeconfig {path}", flush=True)
        print(f"AIRFLOW_CONN_KUBERNETES_DEFAULT='{api.connection_json(path)}'", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
