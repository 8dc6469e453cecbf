"""audit explains reservations (issue #10): which reservations a waiting job
holds, which bind it, and the tier rule (a reservation binds only jobs of its
holder's tier or a less important one)."""

from __future__ import annotations

from framespool.processors.core import CellConfig
from framespool.processors.tools.audit import AuditReport, explain_wait, reservations_view
from tests.support.cell_log import CellLog, codes


def reserved_cell() -> CellLog:
    """n0 and n1 full of sixteen 1-GPU free-tier runs (600 s); two 8-GPU paid
    gangs wait: ``gang`` holds the reservation, ``gang2`` the second one
    (conservative backfill), each on its own node; one free-tier run on
    ``gang``'s node has ended, leaving one GPU free there."""
    log = CellLog(CellConfig(status_interval_s=0, estimate_interval_s=0, reservations=4))
    log.tick()
    log.register("n0")
    log.register("n1")
    for i in range(16):
        log.admit(f"fill{i}", tier="free", tenant="fill", estimate_s=600)
    log.tick()
    log.start_all()
    log.admit("gang", gpus=8, tier="paid", tenant="studio", estimate_s=300)
    log.admit("gang2", gpus=8, tier="paid", tenant="studio2", estimate_s=300)
    log.complete("fill0")  # reservations are placed by a pass that has a free GPU
    log.tick()
    cell = log.refold.cell
    assert cell.reservation_job == "gang" and list(cell.more_reservations()) == ["gang2"]
    (node,) = cell.reservation_nodes
    (other,) = cell.more_reservations()["gang2"][1]
    assert node != other and cell.index.free_total == 1
    assert cell.index.nodes[node].free_count() == 1  # the free GPU is on gang's node
    return log


def test_a_job_blocked_by_a_more_important_tiers_reservation_is_told_the_tier_rule():
    log = reserved_cell()
    log.admit("late", tier="free", tenant="other", estimate_s=5000)
    cell = log.refold.cell
    assert cell.jobs["late"].state == "QUEUED" and cell.index.free_total == 1
    x = explain_wait(cell, "late")
    assert codes(x)[0] == "reservation"
    detail = x["blockers"][0]["detail"]
    assert detail.startswith(f"gang holds {cell.reservation_nodes[0]} until t+")
    assert "(EASY backfill)" in detail
    assert "tier paid: a reservation binds jobs of its holder's tier or a less important one" in (
        detail
    )
    assert "free is less important than paid" in detail
    (shape,) = x["shapes"]
    assert shape["excluded"] == {"reserved for the reservation holder": 1}
    text = AuditReport("late", explanation=x).render()
    assert "reservation 1: gang (tier paid) holds" in text and "binds this job" in text
    assert "blocked (reservation): gang holds" in text


def test_a_more_important_tier_is_not_held_back_by_the_reservation():
    """The same free GPU on the reserved node: an enterprise job of the same
    length starts at once (the core), and audit says the paid reservations do
    not bind an enterprise job while a free-tier job is bound."""
    log = reserved_cell()
    cell = log.refold.cell
    log.admit("vip", tier="enterprise", tenant="other", estimate_s=5000)
    assert cell.jobs["vip"].state != "QUEUED"  # placed on the reserved node's free GPU
    log.admit("vip2", gpus=8, tier="enterprise", tenant="other2", estimate_s=5000)
    x = explain_wait(cell, "vip2")
    assert "reservation" not in codes(x) and "capacity" in codes(x)
    rows = x["reservations"]
    assert [(r["holder"], r["tier"], r["binds"]) for r in rows] == [
        ("gang", "paid", False),
        ("gang2", "paid", False),
    ]
    assert all("less important tier (paid)" in r["why"] for r in rows)
    text = AuditReport("vip2", explanation=x).render()
    assert "reservation 2: gang2 (tier paid) holds" in text
    assert "does not bind this job (held for a less important tier (paid)" in text


def test_the_holders_are_told_which_reservation_they_hold():
    log = reserved_cell()
    cell = log.refold.cell
    first = explain_wait(cell, "gang")
    assert codes(first)[0] == "reservation_holder"
    assert first["blockers"][0]["detail"].startswith("it holds the reservation on ")
    assert "more important tiers are not held back" in first["blockers"][0]["detail"]
    assert [r["binds"] for r in first["reservations"]] == [False, False]  # goes first
    second = explain_wait(cell, "gang2")
    assert codes(second)[0] == "reservation_holder"
    assert (
        "it holds reservation 2 of 2 (conservative backfill) on "
        in (second["blockers"][0]["detail"])
    )
    own = next(r for r in second["reservations"] if r["holder"] == "gang2")
    assert own["why"] == "its own" and not own["binds"]


def test_the_audits_binding_rule_is_the_cores():
    """For every queued job, the nodes of the reservations audit says bind it are
    exactly the nodes the core keeps it off (``reserved_for_others``)."""
    log = reserved_cell()
    log.admit("late", tier="free", tenant="other", estimate_s=5000)
    log.admit("short", tier="free", tenant="other", estimate_s=10)
    log.admit("mid", gpus=2, tier="paid", tenant="other3", estimate_s=5000)
    log.admit("vip2", gpus=8, tier="enterprise", tenant="other2", estimate_s=5000)
    cell = log.refold.cell
    queued = [j for j in cell.jobs.values() if j.state == "QUEUED"]
    assert len(queued) >= 4
    for job in queued:
        holder = job.job_id == cell.reservation_job
        rows = reservations_view(cell, job, job.shape[2])
        audit_nodes = {n for r in rows if r["binds"] for n in r["nodes"]}
        core_nodes = set(cell.reserved_for_others(job.job_id, job.shape[2], holder))
        assert audit_nodes == core_nodes, (job.job_id, rows, core_nodes)
