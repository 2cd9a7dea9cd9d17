"""Approvals: a step that spends real money (or replaces what others read) waits for a person.

A DAG puts :func:`approval` before the step::

    approve = approval("approve", request=approval_request, record=out + ".approval.json")
    check >> approve >> step("keep_service", ..., trigger_rule="none_failed")

When the task runs, ``request(params)`` (the run's params) says what to ask:

* a string: why no approval is needed (e.g. the project's local demo cluster); the task is
  **skipped** with that line in its log, and the step after it runs (its trigger rule
  ``none_failed``: a skipped approval is no refusal);
* a mapping ``{"subject", "body", "hours"}``: Airflow's :class:`ApprovalOperator` asks it
  (Browse -> Required Actions, or the REST API's ``hitlDetails``), ``body`` the plan in
  Markdown, with an optional comment field. **Approve**: the step runs. **Reject**: the step
  is skipped (not failed) and the run ends. No answer within ``hours``: the same as Reject
  (the request's default), recorded as ``timed out``.

Every answer is committed as a small JSON at ``record`` (templated; a temporary name, then
renamed): the DAG, run, decision (``approved``, ``rejected`` or ``timed out``), who (Airflow's
user id and name; none on a time-out), when, the comment and the plan that was approved. The
task log says the same in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param
from airflow.sdk.exceptions import AirflowSkipException

from house.records import commit_json

#: The decisions a record holds.
APPROVED, REJECTED, TIMED_OUT = "approved", "rejected", "timed out"
#: The request's optional comment field (kept in the record).
COMMENT = "comment"


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return str(value)


def decision_of(event: Mapping[str, Any]) -> str:
    """``approved``, ``rejected`` or ``timed out``, from the answer Airflow resumes the task with."""
    chosen = list(event.get("chosen_options") or [])
    if chosen == [ApprovalOperator.APPROVE]:
        return APPROVED
    return TIMED_OUT if event.get("timedout") else REJECTED


class HouseApproval(ApprovalOperator):
    """:class:`ApprovalOperator` whose question comes from the run's params at run time, skipped
    when there is nothing to ask, and whose answer is recorded (see the module)."""

    template_fields = (*ApprovalOperator.template_fields, "record")

    def __init__(
        self,
        *,
        request: Callable[[Mapping[str, Any]], str | Mapping[str, Any]],
        record: str,
        params: Mapping[str, Any] | None = None,  # the DAG's, passed in by Airflow: not asked again
        **kwargs,
    ):
        super().__init__(
            subject="(asked when the run starts)",
            defaults=ApprovalOperator.REJECT,  # a time-out is a refusal
            # only the answer's own field: the run's params (passed in by Airflow) are not asked again
            params={
                COMMENT: Param(
                    None,
                    type=["null", "string"],
                    title="Comment",
                    description="Why (kept with the decision in the run's record).",
                )
            },
            # the request's own hours replace it at run time; set here so the helper timeout of
            # default_args stays the execution timeout
            response_timeout=timedelta(hours=24),
            **kwargs,
        )
        self.request = request
        self.record = record

    def _ask(self, context: Mapping[str, Any]) -> str | Mapping[str, Any]:
        ask = self.request(context["params"])
        if isinstance(ask, str):
            return ask
        missing = {"subject", "body", "hours"} - set(ask)
        if missing:
            raise ValueError(f"{self.task_id}: the approval request has no {', '.join(sorted(missing))}")
        return ask

    def execute(self, context):
        ask = self._ask(context)
        if isinstance(ask, str):
            self.log.info("No approval needed: %s", ask)
            raise AirflowSkipException(f"no approval needed: {ask}")
        self.subject = str(ask["subject"])
        self.body = f"{ask['body'].rstrip()}\n\nThe answer is recorded in `{self.record}`.\n"
        self.response_timeout = timedelta(hours=float(ask["hours"]))
        self.log.info(
            "Asking for approval (Browse -> Required Actions), %s; no answer by then counts as Reject:\n%s",
            f"within {ask['hours']:g} h",
            self.body,
        )
        return super().execute(context)

    def execute_complete(self, context, event: dict[str, Any]) -> Any:
        if "error" in event:  # no answer and no default: the operator's own failure
            return super().execute_complete(context=context, event=event)
        self.validate_chosen_options(event["chosen_options"])
        ask = self._ask(context)
        ti = context["ti"]
        by = event.get("responded_by_user")
        comment = (event.get("params_input") or {}).get(COMMENT)
        decision = decision_of(event)
        record = {
            "kind": "approval",
            "dag_id": ti.dag_id,
            "run_id": ti.run_id,
            "task_id": ti.task_id,
            "decision": decision,
            "by": dict(by) if by else None,
            "at": _iso(event.get("responded_at")),
            "comment": comment or None,
            "subject": None if isinstance(ask, str) else ask["subject"],
            "plan": None if isinstance(ask, str) else ask["body"],
            "within_h": None if isinstance(ask, str) else float(ask["hours"]),
        }
        path = commit_json(self.record, record)
        who = f"by {by.get('name') or by.get('id')}" if by else "nobody answered"
        self.log.info(
            "Decision: %s %s at %s%s; recorded in %s",
            decision,
            who,
            record["at"],
            f" ({comment})" if comment else "",
            path,
        )
        return super().execute_complete(context=context, event=event)


def approval(
    task_id: str, *, request: Callable[[Mapping[str, Any]], str | Mapping[str, Any]], record: str, **overrides: Any
) -> HouseApproval:
    """The approval step (see the module): ``request(params)`` -> a reason to skip, or
    ``{"subject", "body", "hours"}``; ``record``: the URI of the decision's JSON (templated)."""
    return HouseApproval(task_id=task_id, request=request, record=record, **overrides)
