"""Upload an experiment's function and state; skipped per object when the checksum matches.

On knative (``--data-source s3``) everything comes from the data bucket, as in the manual:
the function (``data.function_key``: ``inv upload``), the SGD and TF archives, and for the
matrix experiment one archive per size (``matrix/<N>x<N>_2.tar``: created from the seed when
missing, the manual's ``matrix-upload-s3``; downloaded again for each size by ``run``)."""

from __future__ import annotations

from stepkit import StepError

from ..clients import UploadClient, UploadError
from ..common import add_common, load_plan, run_date
from ..data import prepare
from ..results import write_op_report
from ..targets import get_target


def add_arguments(p):
    add_common(p, experiment=True, experiment_required=True)
    p.add_argument(
        "--data-source",
        choices=["auto", "synthetic", "s3"],
        default="auto",
        help="auto = synthetic on the local target, s3 on knative",
    )
    p.add_argument("--bucket", help="S3 bucket (default from the catalogue, faasm-data)")
    p.add_argument("--key", help="S3 key of the archive (default from the catalogue)")
    p.add_argument("--s3-endpoint-url", help="S3 endpoint (e.g. a MinIO or moto server)")
    p.add_argument("--function-file", help="wasm or Python function to PUT to /f or /p first")
    p.add_argument(
        "--function-source",
        choices=["auto", "s3", "none"],
        default="auto",
        help="upload the function from s3://<bucket>/<catalogue data.function_key> (auto: on knative, "
        "for wasm and Python functions; the local target runs its own workers)",
    )
    p.add_argument("--force", action="store_true", help="upload even when the checksum matches")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout seconds")


def run(args) -> int:
    date = run_date(args)
    plan = load_plan(args)
    source = args.data_source if args.data_source != "auto" else ("synthetic" if args.target == "local" else "s3")
    ep = get_target(args.target, args).endpoints()
    client = UploadClient(ep.upload_url, timeout_s=args.timeout)
    try:
        reports = prepare(
            plan,
            client,
            source,
            force=args.force,
            bucket=args.bucket,
            key=args.key,
            endpoint_url=args.s3_endpoint_url,
            function_file=args.function_file,
            function_source=(
                ("none" if args.target == "local" else "s3") if args.function_source == "auto" else args.function_source
            ),
        )
    except UploadError as exc:
        raise StepError(f"upload failed: {exc}") from exc
    up = sum(r["action"] == "uploaded" for r in reports)
    write_op_report(
        args.results, date, args.run_id, "upload-data", {"experiment": plan.name, "source": source, "objects": reports}
    )
    print(f"upload-data: {up} uploaded, {len(reports) - up} unchanged (skipped)", flush=True)
    return 0
