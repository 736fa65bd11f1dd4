"""One effective priority: what `queue why` shows, the order the monitor numbers the queue in
and the order the placer considers it are the same figure (``scheduler.priority``)."""
from __future__ import annotations

from iadeep_cli.controller.fairshare import FairShareRound
from iadeep_cli.controller.requests.views import StoreReader
from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.scheduler import priority
from iadeep_cli.scheduler.priority import effective_priority, order_queue
from iadeep_cli.settings import FairShare, Inventory, Policy
from iadeep_cli.store import Store, jobrows
from iadeep_cli.tui.viewmodel import job_rows, queue_key

# A wait for which 3.0 x (wait / 3600) and 3.0 x wait / 3600 differ in the last bit (so do
# the sums with priority 2 and 10 fair-share points): two spellings of the formula disagree.
NOW, SUBMITTED, AGING = 1_700_714_338.0, 1_700_672_817.000281, 3.0


def test_queue_why_the_monitor_and_the_placer_rank_by_one_figure(tmp_path):
    store = Store(tmp_path / "s.db")
    with store.tx() as c:
        first, _ = jobrows.insert(c, "alice", JobSpec("/j.sh", priority=2), SUBMITTED)
        second, _ = jobrows.insert(c, "bob", JobSpec("/j.sh", priority=2), SUBMITTED + 1)
    policy = Policy(aging_per_hour=AGING, fairshare=FairShare())
    points = FairShareRound().points(store, policy, NOW)
    assert points == {"alice": 10.0, "bob": 10.0}   # nobody used anything: the full weight
    reader = StoreReader(store, clock=lambda: NOW, inventory=Inventory(nodes=(), policy=policy))
    shown = reader.job(first)
    job = Job(first, "alice", JobSpec("/j.sh", priority=2), JobState.QUEUED, SUBMITTED)
    placer = effective_priority(job, policy, NOW, points)
    assert shown.priority is not None and shown.priority.effective == placer   # exactly
    assert shown.priority.aging == priority.aging(SUBMITTED, NOW, AGING)
    assert queue_key(shown.job, NOW, AGING, points) == (-placer, SUBMITTED, first)
    # the monitor's rows and the placer's order agree, ties broken alike
    views = [reader.job(i).job for i in (second, first)]
    jobs = [Job(second, "bob", JobSpec("/j.sh", priority=2), JobState.QUEUED, SUBMITTED + 1),
            job]
    assert [r.id for r in job_rows(views, NOW, aging_per_hour=AGING, fairshare=points)] \
        == [j.id for j in order_queue(jobs, policy, NOW, points)] == [first, second]
    store.close()


def test_an_older_heartbeat_without_aging_reads_as_the_default():
    assert priority.recorded_aging(None) == Policy().aging_per_hour
    assert priority.recorded_aging(0.0) == 0.0


def test_a_ranked_queue_kept_through_adds_and_pops_orders_as_order_queue_sorts():
    import random
    rng = random.Random(7)
    ranked = priority.RankedQueue()
    jobs: dict[int, Job] = {}
    for step in range(400):
        if jobs and rng.random() < 0.4:
            gone = rng.choice(sorted(jobs))
            assert ranked.pop(gone) is jobs.pop(gone)
        else:   # arrivals, and jobs back from preemption with an old submission time
            job = Job(step, rng.choice(["ann", "bo"]),
                      JobSpec("/j.sh", workload=rng.choice(["a", "b"]), gpus=rng.choice([1, 2])),
                      JobState.QUEUED, float(rng.randrange(0, 50)))
            jobs[job.id] = job
            ranked.add(job)
        plain = list(jobs.values())
        assert order_queue(ranked, Policy(), 100.0) == order_queue(plain, Policy(), 100.0)
        assert len(ranked) == len(plain) and list(ranked) == ranked.ranked()
    # per alike class (spec, owner, time limit), the last job after a given one
    head = ranked[0]
    lasts = ranked.last_of_classes_after(head)
    classes = {priority.alike_class(j) for j in ranked[1:]}
    assert {priority.alike_class(j) for j in lasts} == classes
    for j in lasts:
        assert j is max((k for k in ranked if priority.alike_class(k) == priority.alike_class(j)),
                        key=lambda k: (k.submitted_at, k.id))
    assert ranked.last_of_classes_after(ranked[-1]) == []


def test_a_ranked_queue_with_two_priorities_or_fair_share_is_ranked_by_the_formula():
    low = Job(1, "ann", JobSpec("/j.sh", priority=0), JobState.QUEUED, 10.0)
    high = Job(2, "bo", JobSpec("/j.sh", priority=5), JobState.QUEUED, 20.0)
    ranked = priority.RankedQueue([low, high])
    assert list(ranked) == [low, high]   # by submission
    assert order_queue(ranked, Policy(), 30.0) == [high, low]
    ranked.pop(2)
    assert order_queue(ranked, Policy(), 30.0, {"ann": 1.0}) == [low]
    assert order_queue(ranked, Policy(), 30.0) == [low]
