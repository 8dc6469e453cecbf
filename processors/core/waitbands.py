"""Calibrated wait bands: a P50 and a P90 around the core's point estimate.

Theory of operation
-------------------
The point estimate (``WaitEstimates.predicted_wait_s``: fair-order work ahead,
the job's own GPUs' residual and the running work the queue ahead waits
behind, over capacity) is biased in ways that depend on the load,
the tier and the job's shape. Rather than model them, the band learns them:

1. At admission a job's point estimate ``e`` and its admission time are kept
   (``admitted``).
2. When the job first starts, its actual wait ``a`` gives the ratio
   ``r = (a + FLOOR_S) / (e + FLOOR_S)`` (the floor keeps ``e = 0`` and
   ``a = 0`` finite: a job that was told 0 and started at once has r = 1).
   ``log2 r`` goes into a fixed-bucket histogram per (tier, estimate class)
   and, for jobs that had to queue (class >= 1), per tier (``started``).
   Jobs told "starts now" (class 0) stay in their own class: a burst of them
   says nothing about the spread of a queue's waits.
3. A band is ``(e + FLOOR_S) * m_q - FLOOR_S`` (at least 0) for the P50
   (q = 0.5) and the P90 (q = 0.9), where ``m_q`` is the q-quantile of the
   ratios of the job's (tier, class), or of its tier while the class has
   fewer than ``MIN_SAMPLES``, or the depth prior before anything was learned
   (``band``). The quantile is a Kaplan-Meier estimate (``censor``): the jobs
   still queued are right-censored observations at their wait so far, so a
   backlog's longest waits count before they end. Reading only the jobs that
   started biases both quantiles low whenever waits grow (every job that
   started waited less than the ones still queued); reading a higher
   quantile instead (this module read its P90 at 0.95) over-covers a steady
   load (95 % under the P90) and still under-covers a growing one
   (``test_waitbands_stream``).
4. The depth prior. A deep queue's wait is the sum of many jobs' run times
   over the capacity, so its relative spread shrinks like one job's spread
   over the square root of the number of jobs ahead (the law of large
   numbers): ``m50 = 1`` and ``m90 = exp(Z90 * sqrt(SIGMA_SYS**2 +
   SIGMA_JOB**2 / depth))``, ``depth`` = jobs' worth of work the point
   estimate drains (``WaitEstimates.wait_depth``: the queued work ahead that the
   point estimate times the capacity holds, over the mean cost of a queued
   job). At most one job deep the
   wait is one residual run time, which averages nothing: the fixed
   ``PRIOR`` (``m90 = 3``). A flood admitted into a fresh cell (every job
   admitted before any queued job starts, so nothing is learned in time)
   gets a P90 ~14 % above its point estimate instead of three times it.
   ``SIGMA_SYS`` is what the sum does not average away: the whole queue's
   run times against its estimates, one factor for every job in it
   (estimates biased one way, the share of runs that load their model
   guessed before any run ended), 8 % (log). Measured on the default flood
   with the model loads in the point (``WaitEstimates.load_terms``): its jobs
   waited the point +12 % (shallowest tenth) to -3 % (deepest), as without
   cold starts (+15 % to -2.5 %); at 10 % its P90 covered 96.0 % (94.4 %
   without cold starts), at 8 % 93.7 % (93.2 %).
   The P50 stays the point estimate: its bias (backfill past blocked work,
   how estimates compare with run times) is only learned from jobs that
   started (3.).
5. Histograms forget: when one holds ``HALVE_AT`` observations, every
   bucket is halved, so the band follows a drifting load (old evidence weighs
   half each time the window fills). The refreshes' histograms (6.) halve at
   ``REFRESH_HALVE_AT``, half that: a refresh is scored only when its job
   starts, so what they know lags the queue by its wait, and a draining queue
   changes regime as it goes (the default flood's refreshes waited 0.93x
   their point in its second minute and 0.98-1.0x from its fourth, while the
   learned P50 still read 0.93). Refreshed <= P50 / <= P90 at 4,000 -> 2,000:
   flood seeds 1-3 37.9 / 92.3 -> 42.3 / 91.9, 56.5 / 95.2 -> 57.9 / 95.2,
   54.3 / 89.6 -> 55.9 / 89.7; `--jobs 5000 --nodes 50` 44.9 / 91.5 -> 50.4 /
   91.4; multitenant 53.2 / 93.8 -> 53.1 / 93.8 (1,000 put seed 2 at 60.5 /
   96.0, 500 at 67.7 / 97.1).

6. Refreshed estimates of a queued job are forecasts of the wait left from a
   point computed in another regime (the queue ahead has partly drained, the
   running work is other work), so they learn their own histograms: every
   refresh the cell publishes is kept (``refreshed``) and scored at the job's
   start against the wait left (key ``(tier, REFRESH + class)``, the class of
   its point), censored like the admissions. Measured on the default flood
   before this (the admission multipliers on refreshed points): 99.5 % of
   refreshes under their P50.
   Every refresh, not a job's first in each class: the scored population is
   every published refresh, and a job's first refresh in a decade is made
   as its point enters it from above, earlier than the rest, in another
   regime (the default flood's first ones waited 0.93x their point, the later
   ones 0.98-1.0x; learning only the first put 29 % of its refreshes under
   their P50, 90 % under their P90; learning all of them, 38 % and 92 %; on
   the multitenant workload 62 % / 88 % before, 49 % / 94 % after, and the
   paid tier's P90 81 % -> 93 %). A refresh is published only when its
   point moved by 20 % (``Cell.publish_estimates``): 4.6 per job on the
   default flood, but a multitenant job queued for hours is published up to
   ~90 times, and a fleet cell kept ~4,000 refreshes beside ~230 queued jobs
   (censoring them was 10 % of its CPU, and every snapshot carried them). A
   job keeps at most ``KEEP_REFRESHES`` (8): past that, two of one class merge
   into the older with both weights (``_merge_oldest``, a binary counter per
   class), so every published refresh still counts once, older ones through
   a neighbour's ratio. Multitenant refreshes: 48.9 / 93.9 % kept whole,
   53.2 / 93.8 % with 8 (50.4 / 93.8 with 16); the flood keeps fewer than 8.
   Until a refresh class has ``MIN_REFRESH_SAMPLES`` it has the depth prior (4.), not
   another decade's refreshes: their ratios do not carry across decades. On
   the multitenant workload the batch tier's refreshes of 10^4-10^5 s, a third
   of all refreshes, had no starts of their own until their backlog drained
   (they start after it), and the tier's pool of every decade's refreshes,
   which they read, told them 16x (P50) and 64x (P90) their point while they
   waited 0.36x (median) and 0.78x (90th percentile) of it; with the pool the
   refreshes were 66.3 % under their P50 and 96.8 % under their P90, with the
   depth prior 62.6 % and 86.1 % (the default flood's refresh classes fill in
   its first minutes: unchanged).
7. Held admissions. A job whose shape fit the free GPUs at admission but that
   the admission's quick pass left queued (a reservation, a guarantee, a cap or
   the pass's budget held the GPUs) mostly starts at the next full pass,
   whatever its point says: on the multitenant workload (``framespool
   simulate --synthetic multitenant --estimates``, each admission's
   ``fits_free_now`` joined with jobs.csv; the figures in 8. and 9. are the
   same command's calibration table) 93 % of the batch
   tier's such jobs told 10-100 s started within 2 s, and 76 % of the paid
   tier's, against 4 % of the paid jobs of that class that did not fit. Mixed
   into their point's class, they made it learn two populations at once, and
   the told-a-wait jobs of the batch and paid tiers were 64 % and 66 % under
   their P50. So a held admission learns into and reads its own class
   (``admission_class``: ``HELD`` + its point's class; the tier's pool is
   shared as before), and a held class of points under 100 s
   (``HELD_WAIT_CLASS``) learns the wait itself, not its ratio to the point
   (``frame``: a point of 0 and the floor ``HELD_FLOOR_S``, so waits up to
   252 s are resolved, longer ones clamped). Held classes of longer points wait
   on the queue like the others (16-18 % of the batch and paid tiers' held
   jobs told 100-1,000 s started within 2 s) and keep the point's frame: in
   the wait's frame that class's P90 covered 52 %.
8. The clock's grain. The cell's clock is the Tick's (``Cell.on_tick``): an
   admission between two Ticks is stamped at the one before, so a job the next
   full pass starts waited one Tick on the cell's clock and a uniform share of
   one in fact. The q-quantile of an admission's real wait is so about the
   measured one less (1 - q) Tick (exact for the jobs the next pass starts, a
   fraction of a Tick off for the rest): an admission's P50 is half a Tick
   below the learned one, its P90 a tenth (``tick_ms``, the smaller of the
   last two gaps between Ticks: a second in production; one long gap, a clock
   that was down, is not the grain). A refresh is made on a Tick and is not
   moved. With 7. and 8., the multitenant workload's told-a-wait admissions
   under their P50 / P90: batch 63.8 / 94.5 -> 47.2 / 94.0 %, paid 66.3 / 91.8
   -> 52.1 / 91.8 %, enterprise 46.2 / 87.8 -> 47.8 / 88.1 %, free 49.0 /
   89.6 -> 48.7 / 90.3 %, all 60.0 / 91.8 -> 49.5 / 91.8 % (interactive, 50
   jobs: 74 -> 72 %); the default flood 56.2 -> 54.2 % (seeds 2 and 3: 48.4 ->
   47.8, 67.3 -> 65.6 %; their P90s unchanged). Decisions are unchanged
   (runs.csv byte-identical).
9. How soon a class reads its own quantiles. An admission class reads them
   from ``MIN_SAMPLES`` (15) starts, before that its tier's pool or the depth
   prior; a refresh class from ``MIN_REFRESH_SAMPLES`` (30), before that the
   depth prior. A tier that seldom queues lives on the prior for long: the
   multitenant workload's interactive tier queued 50 jobs in 10,000 (they
   wait for preemption, ~3 s, against points of ~16 s, the time for their
   GPUs to free without it), 30 of them before their class had 30 starts,
   and 72 % were under their P50; with 15, 56 % (all told-a-wait
   admissions 49.5 -> 50.0 %, every tier within 40-60 / 85-95). Refresh
   classes keep 30: at 15 the batch tier's refreshes of 10^4-10^5 s, whose
   first starts come when their backlog drains, read those and fell to 34 %
   under their P50 (from 53 %).

10. Which frame a class reads. A ratio to the point is right where the wait
   grows with the point (a whole-node job behind a queue of them), wrong where
   the wait barely depends on it: on the genai workload (``framespool
   simulate --synthetic genai --jobs 27000 --nodes 128 --gpus-per-node 8
   --estimates``) the paid tier's 1-4 GPU jobs told points of 100-3,000 s
   started within seconds whatever their point (their waits were 2-9 % of
   it), so a learned multiplier gave the larger points of a class a P50 above
   their wait and the smaller ones a P50 clamped to 0 (told "starts now",
   not scored): 89 % of the scored ones were under their P50. So every
   admission class that learns in the point's frame also learns its waits
   in their own frame (key ``(tier, WAIT + class)``, floor ``WAIT_FLOOR_S``),
   censored alike, and keeps a score of the two frames: at each start, the
   pinball losses (q = 0.5 and 0.9, seconds) of the band each would tell
   now, the point's minus the wait's, decayed by ``FRAME_MEMORY`` per start,
   one score per quantile. Each quantile reads the waits' frame while its
   score is positive and the histogram has ``MIN_SAMPLES`` (one score for
   both moved the multitenant paid tier's P90 from 88.9 to 84.1 %: its waits'
   frame won on the P50 and lost on the P90); otherwise as before (the point's class,
   its tier's pool, the depth prior). Held classes that wait themselves (7.)
   and class 0 are unchanged. The clock's grain (8.) is taken out where it
   arises: a start in a Tick's pass is learned half a Tick shorter (its
   admission was stamped at the Tick before, its start on the Tick), one
   on another input (a victim's exit, a run's end) as measured (both
   stamps at the Tick before), and the waits' band is told as learned. The
   interactive tier's waits are mostly the latter: with the admission's
   half Tick taken off its told P50, 39 % of its jobs were under it.

11. The told P50's online correction. The learned quantiles are honest per
   histogram, but a tier's told P50 mixes classes, frames (10.) and held
   admissions (7.) that drift apart under a growing backlog, so a tier can sit
   off a half all the same (genai: batch 62.3 %, interactive 37.4 % under
   their told P50, every other tier within 40-60 %). So each band key keeps a
   log2 offset on its admissions' told P50 (``p50_adj``), moved at every
   start of a job told a positive P50 by ``P50_STEP`` against the miss
   (adaptive conformal inference on the P50: down by ``P50_STEP / 2`` when
   the job started within it, up as much when not), within
   ``P50_ADJ_LIMIT``. Its long-run share under the told P50 is a half
   whatever the histograms' bias; the P90 is not moved (it is only ever
   raised to the P50). Refreshes and told-0 admissions are unchanged, and so
   are decisions (runs.csv byte-identical). Told > 0 under their P50, genai
   before -> after (same session): batch 62.3 -> 58.8 %, interactive 37.4 ->
   42.5 %, enterprise 59.6 -> 50.2 %, paid 54.0 -> 52.4 %, free 44.5 -> 45.9 %
   (P90s 87.5-90.1 %); with a step of 0.05, 60.6 / 38.7 %: a key's few
   hundred scored starts, most told long before their feedback, need the
   larger step. Multitenant batch 55.7 -> 56.0, enterprise 54.3 -> 50.6,
   free 51.6 -> 51.4, paid 51.5 -> 52.2 % (interactive, 56 jobs: 76.8 ->
   62.5 %); the flood is admitted before any start: unchanged.

Everything is plain arithmetic on the event's time: deterministic, replayable.

Cost: ``admitted``/``forget``/``ticked`` O(1), ``refreshed`` O(1) until a job keeps
``KEEP_REFRESHES``, then O(KEEP_REFRESHES**2) for the merge; the depth prior O(1);
``started`` O(KEEP_REFRESHES) plus, when a histogram
fills, an O(BUCKETS) halving (amortized O(BUCKETS / HALVE_AT)); ``band``
O(1) when its quantiles are cached, else O(BUCKETS) once per histogram
change (BUCKETS = 193, so at most a few hundred additions per admission);
``censor`` O(pending + kept refreshes + histograms) (a held job of a point
under 100 s counts twice, in its class's frame and the pool's), on the estimate
cadence only.
Memory: one pending entry per queued-never-started job, at most
``KEEP_REFRESHES`` refreshes per queued job, plus O(BUCKETS * tiers * classes).
"""

from __future__ import annotations

import math
from typing import cast

FLOOR_S = 30.0  # additive floor of the ratio (s)
STEP = 0.0625  # histogram bucket width in log2 units (about 4.4% in ratio)
LOW, HIGH = -6.0, 6.0  # log2 range; ratios outside are clamped to the end buckets
BUCKETS = int((HIGH - LOW) / STEP) + 1
MIN_SAMPLES = 15  # an admission class's starts before its own quantiles are read (9.)
MIN_REFRESH_SAMPLES = 30  # a refresh class's (6., 9.)
HALVE_AT = 4000.0
REFRESH_HALVE_AT = 2000.0  # the refreshes' histograms forget twice as fast (5.)
PRIOR = (1.0, 3.0)  # (m50, m90) before anything was observed, one job deep
Z90 = 1.2816  # the standard normal's 0.9 quantile
SIGMA_JOB = 0.6  # relative spread of one job's run time (durations ~50%, estimates ~25% off)
SIGMA_SYS = 0.08  # log-spread a deep queue does not average away (module doc, 4.)
QUANTILES = (0.5, 0.9)  # Kaplan-Meier over started and still-queued jobs (module doc, 3.)
REFRESH = 10  # class offset of the histograms learned from refreshed estimates (6.)
HELD = 20  # class offset of admissions the quick pass held while they fit the free GPUs (7.)
HELD_WAIT_CLASS = 2  # held classes up to this one (points < 100 s) learn the wait itself (7.)
HELD_FLOOR_S = 4.0  # their ratios: (a + 4) / 4, a point of 0 (7.)
KEEP_REFRESHES = 8  # a queued job's kept refreshes; older ones merge, weights summed (6.)
WAIT = 30  # class offset of an admission class's waits in their own frame (10.)
WAIT_FLOOR_S = 8.0  # their frame: (a + 8) / 8, so waits up to ~500 s are resolved (10.)
FRAME_MEMORY = 0.99  # decay of a class's pinball-loss score per start (10.)
P50_STEP = 0.2  # log2 step of a key's told-P50 offset per scored start (11.)
P50_ADJ_LIMIT = 2.0  # the offset stays within +-2 (x0.25 .. x4) (11.)
HELD_TAU_S = 900.0  # time constant of a flow's averaged GPUs held (its service rate)


def estimate_class(point_s: float) -> int:
    """0 for 'starts now', then one class per decade of the point estimate."""
    if point_s <= 0:
        return 0
    return 1 + min(5, max(0, int(math.log10(max(point_s, 1.0)))))


def admission_class(point_s: float, held: bool) -> int:
    """The histogram class of an admission's point: ``estimate_class``, offset
    by ``HELD`` for a job whose shape fit the free GPUs and that the admission's
    quick pass still left queued (module doc, 7.)."""
    cls = estimate_class(point_s)
    return cls + HELD if held and cls else cls


def waits_itself(cls: int) -> bool:
    """Whether a class learns the wait itself rather than its ratio to the
    point: a held class of points under 100 s (module doc, 7.)."""
    return HELD < cls <= HELD + HELD_WAIT_CLASS


def frame(key: tuple[str, int] | None, point_s: float) -> tuple[float, float]:
    """(floor, base) of the ratios a histogram holds (``None``: the depth
    prior's): a wait ``a`` is the ratio ``(a + floor) / base`` and a multiplier
    ``m`` the band ``base * m - floor``. The point's: ``(FLOOR_S, point +
    FLOOR_S)``; a class that ``waits_itself`` ignores the point:
    ``(HELD_FLOOR_S, HELD_FLOOR_S)``."""
    if key is not None:
        if waits_itself(key[1]):
            return HELD_FLOOR_S, HELD_FLOOR_S
        if key[1] > WAIT:
            return WAIT_FLOOR_S, WAIT_FLOOR_S
    return FLOOR_S, point_s + FLOOR_S


def wait_class(cls: int) -> int | None:
    """The class an admission class learns its waits into, in their own frame
    (module doc, 10.); None for class 0 and the held classes that already
    wait themselves."""
    if cls <= 0 or waits_itself(cls):
        return None
    return WAIT + cls


def depth_prior(depth: float) -> tuple[float, float]:
    """(m50, m90) before anything was learned, for a wait ``depth`` jobs deep."""
    if depth <= 1.0:
        return PRIOR
    return PRIOR[0], math.exp(Z90 * math.sqrt(SIGMA_SYS**2 + SIGMA_JOB**2 / depth))


def _within(i: int, frac: float) -> float:
    """The ratio ``frac`` of the way through bucket ``i``, which holds the
    log-ratios within half a ``STEP`` of its centre (``Histogram.multipliers``)."""
    return 2.0 ** (LOW + (i - 0.5 + min(1.0, max(0.0, frac))) * STEP)


def _bucket(log_ratio: float) -> int:
    return int(round((min(HIGH, max(LOW, log_ratio)) - LOW) / STEP))


class Histogram:
    __slots__ = ("counts", "total", "cached", "censored", "censored_total")

    def __init__(self) -> None:
        self.counts = [0.0] * BUCKETS
        self.total = 0.0
        self.cached: tuple[float, float] | None = None
        # jobs still queued, by the bucket of their wait so far (right-censored)
        self.censored: dict[int, float] = {}
        self.censored_total = 0.0

    def set_censored(self, buckets: dict[int, float]) -> None:
        if buckets == self.censored:
            return
        self.censored = buckets
        self.censored_total = sum(buckets.values())
        self.cached = None

    def add(self, log_ratio: float, weight: float = 1.0, halve_at: float = HALVE_AT) -> None:
        i = _bucket(log_ratio)
        self.counts[i] += weight
        self.total += weight
        self.cached = None
        if self.total >= halve_at:
            self.counts = [c / 2 for c in self.counts]
            self.total /= 2

    def multipliers(self) -> tuple[float, float]:
        """(m50, m90): the Kaplan-Meier quantiles of the ratios, over the
        buckets, read where the survival curve crosses the quantile within its
        bucket (the bucket's starts taken as spread evenly over its width): a
        bucket is 4.4 % wide and a deep queue's ratios spread a few %, so
        reading the bucket's centre put both quantiles up to 2.2 % off. A bucket's starts leave the risk set before its censored
        jobs (a job queued that long is still at risk of a longer wait). A
        quantile the starts do not reach (the rest is still queued past every
        start): the P50 with the queued jobs counted at their wait so far, the
        P90 the longest ratio seen; both lower bounds, still a band."""
        if self.cached is None:
            out = []
            want = iter(QUANTILES)
            q: float | None = next(want)
            at_risk = self.total + self.censored_total
            survival = 1.0
            extra = self.censored
            for i, ended in enumerate(self.counts):
                if ended > 0 and at_risk > 0:
                    before = survival
                    survival *= 1.0 - ended / at_risk
                    while q is not None and 1.0 - survival >= q - 1e-9:
                        # where in the bucket the curve crosses q (its starts spread evenly)
                        out.append(_within(i, (q - 1.0 + before) / (before - survival)))
                        q = next(want, None)
                    if q is None:
                        break
                at_risk -= ended + (extra.get(i, 0.0) if extra else 0.0)
            if q is not None:
                # the rest is still queued past every start: the P50 counts each
                # queued job at its wait so far (a lower bound); the P90 is the
                # longest ratio seen, started or queued (the queued still wait)
                total = self.total + self.censored_total
                seen = 0.0
                top = 0
                for i, ended in enumerate(self.counts):
                    c = ended + (extra.get(i, 0.0) if extra else 0.0)
                    if c <= 0:
                        continue
                    top = i
                    seen += c
                    if len(out) == 0 and seen >= q * total - 1e-9:
                        out.append(2.0 ** (LOW + i * STEP))
                while len(out) < len(QUANTILES):
                    out.append(max(out[-1] if out else 0.0, 2.0 ** (LOW + top * STEP)))
            self.cached = (out[0], out[1])
        return self.cached


class WaitBands:
    """Per-tier learned spread of actual over estimated waits (see the module
    doc), and each fair-share flow's recent service rate (``sample_held``)."""

    # whether the cell is in a Tick's pass (``Cell.on_tick``): a start there
    # is stamped up to a Tick after the admission's stamp (module doc, 10.)
    in_tick = False

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled  # False: the prior forever (a test's control)
        # job -> (tier, ms, point, class): its admission point (``admission_class``)
        self.pending: dict[str, tuple[str, int, float, int]] = {}
        self.hists: dict[tuple[str, int], Histogram] = {}  # (tier, class or -1)
        # job -> (tier, [(refresh class, ms, point, weight)]): its published
        # refreshes, at most KEEP_REFRESHES, older ones merged (6.)
        self.rpending: dict[str, tuple[str, list[tuple[int, int, float, float]]]] = {}
        # flow path ((tier,), (tier, tenant), (tier, tenant, user)) -> GPUs its
        # runs held, averaged (HELD_TAU_S); a flow decayed under 0.01 is dropped
        self.held: dict[tuple[str, ...], float] = {}
        self.held_ms = -1  # when ``held`` was last sampled
        self.gaps_ms = (0, 0)  # the last two gaps between Ticks, newest first (8.)
        # (tier, admission class) -> the point's frame's pinball loss less the
        # waits' frame's, decayed (10.): positive, the class reads its waits
        self.frame_score: dict[tuple[str, int], tuple[float, ...]] = {}
        # band key -> log2 offset of its admissions' told P50 (11.); job -> the
        # positive P50 it was told at admission, until it starts
        self.p50_adj: dict[str, float] = {}
        self.told50: dict[str, float] = {}

    def __setstate__(self, state: dict) -> None:
        """Unpickle; a snapshot taken before service rates were kept starts without them."""
        self.__dict__.update(state)
        if "held" not in state:
            self.held = {}
            self.held_ms = -1
        if "rpending" not in state:
            self.rpending = {}
        if "gaps_ms" not in state:  # before the clock's grain was kept (8.)
            self.gaps_ms = (0, 0)
        if "frame_score" not in state:  # before classes learned their waits (10.)
            self.frame_score = {}
        if "p50_adj" not in state:  # before the told P50's correction (11.)
            self.p50_adj = {}
            self.told50 = {}
        for job_id, entry in list(self.pending.items()):
            if len(entry) == 3:  # before the held classes (7.): the point's class
                self.pending[job_id] = (*entry, estimate_class(entry[2]))
        for job_id, (tier, seen) in list(self.rpending.items()):
            if isinstance(seen, dict):  # kept the first refresh per class only
                self.rpending[job_id] = (tier, [(c, ms, p, 1.0) for c, (ms, p) in seen.items()])
            elif seen and len(seen[0]) == 3:  # kept every refresh, unweighted (16316e0)
                self.rpending[job_id] = (tier, [(c, ms, p, 1.0) for c, ms, p in seen])
        # the tiers' pools of refreshes (-2), which nothing reads any more (6.)
        for key in [k for k in self.hists if k[1] == -2]:
            del self.hists[key]

    def sample_held(self, now_ms: int, held: dict[tuple[str, ...], int]) -> None:
        """Fold one sample of the GPUs each flow's runs hold now into an
        exponential average with time constant ``HELD_TAU_S`` (a flow absent
        from ``held`` holds 0; one decayed under 0.01 GPUs is forgotten). A
        backlogged flow's queue drains at the rate it is served, which is the
        GPUs it holds: what its fair share, the flows served before it and
        their future arrivals leave it, measured rather than modelled
        (``WaitEstimates.drain_wait_s``). O(flows that held GPUs lately); taken on
        the estimate cadence."""
        if self.held_ms < 0:
            self.held = {flow: float(n) for flow, n in held.items()}
        else:
            dt_s = max(0.0, (now_ms - self.held_ms) / 1000)
            alpha = 1.0 - math.exp(-dt_s / HELD_TAU_S)
            for flow in [*self.held, *(f for f in held if f not in self.held)]:
                old = self.held.get(flow, 0.0)
                new = old + alpha * (held.get(flow, 0) - old)
                if new < 0.01 and flow not in held:
                    del self.held[flow]
                else:
                    self.held[flow] = new
        self.held_ms = now_ms

    def held_gpus(self, flow: tuple[str, ...]) -> float:
        """The flow's averaged GPUs held (0 before its first sample). O(1)."""
        return self.held.get(flow, 0.0)

    def multipliers(
        self, tier: str, cls: int, depth: float, refresh: bool
    ) -> tuple[float, float, tuple[str, int] | None]:
        """(m50, m90, the histogram they were read from; None for the prior) for
        a point of class ``cls`` (``admission_class``, or ``estimate_class`` of
        a refresh's point), in the point's frame."""
        need = MIN_REFRESH_SAMPLES if refresh else MIN_SAMPLES
        for key in _keys(tier, cls, refresh):
            hist = self.hists.get(key)
            if hist is not None and hist.total >= need:
                return (*hist.multipliers(), key)
        return (*depth_prior(depth), None)

    def reads(
        self, tier: str, cls: int, depth: float, refresh: bool
    ) -> tuple[tuple[float, tuple[str, int] | None], ...]:
        """Per quantile (``QUANTILES``), its multiplier and the histogram it is
        read from: the point's frame (``multipliers``), or for an admission
        class whose waits' frame scores better on that quantile, the waits'
        (module doc, 10.)."""
        m50, m90, key = self.multipliers(tier, cls, depth, refresh)
        out = [(m50, key), (m90, key)]
        own = None if refresh else wait_class(cls)
        score = self.frame_score.get((tier, cls)) if own is not None else None
        if score is not None:
            hist = self.hists.get((tier, cast(int, own)))
            if hist is not None and hist.total >= MIN_SAMPLES:
                waits = hist.multipliers()
                for q in range(len(QUANTILES)):
                    if score[q] > 0:
                        out[q] = (waits[q], (tier, cast(int, own)))
        return tuple(out)

    def band(
        self,
        tier: str,
        point_s: float,
        depth: float = 1.0,
        refresh: bool = False,
        held: bool = False,
    ) -> tuple[float, float]:
        """(P50, P90) in seconds for a point estimate; (-1, -1) if it is unknown.
        ``depth``: jobs' worth of queued work the estimate drains (the depth prior);
        ``refresh``: a queued job's refreshed point (module doc, 6.); ``held``: an
        admission the quick pass left queued while it fit the free GPUs (7.)."""
        if point_s < 0:
            return -1.0, -1.0
        cls = admission_class(point_s, held and not refresh)
        told = []
        for q, (m, key) in zip(QUANTILES, self.reads(tier, cls, depth, refresh)):
            floor, base = frame(key, point_s)
            # an admission's band: the cell's clock stamped it at the Tick
            # before (8.); a waits' frame learned its waits with that out (10.)
            waits = key is not None and key[1] > WAIT
            grain = 0.0 if refresh or waits else self.tick_ms / 1000
            told.append(max(0.0, base * m - floor - (1.0 - q) * grain))
        if not refresh and self.enabled:
            told[0] *= 2.0 ** self.p50_adj.get(tier, 0.0)  # (11.)
        return told[0], max(told)  # frames read apart: the P90 never under the P50

    @property
    def tick_ms(self) -> int:
        """The cell's clock's grain (module doc, 8.): the smaller of the last
        two gaps between Ticks, so one long gap (the clock was down) is not
        taken for the cadence, and a new cadence is from its second gap. O(1)."""
        last, before = self.gaps_ms
        return min(last, before) if before else last

    def ticked(self, gap_ms: int) -> None:
        """The cell's clock moved ``gap_ms`` on a Tick. O(1)."""
        if gap_ms > 0:
            self.gaps_ms = (gap_ms, self.gaps_ms[0])

    def admitted(
        self, job_id: str, tier: str, now_ms: int, point_s: float, held: bool = False
    ) -> None:
        """A job queued at admission with this point (``held``: module doc, 7.)."""
        if point_s >= 0:
            self.pending[job_id] = (tier, now_ms, point_s, admission_class(point_s, held))

    def refreshed(self, job_id: str, tier: str, now_ms: int, point_s: float) -> None:
        """A queued job's published refreshed point, kept until the job starts
        (module doc, 6.). O(1), O(KEEP_REFRESHES**2) once a job keeps that many."""
        if point_s < 0 or not self.enabled:
            return
        entry = self.rpending.get(job_id)
        if entry is None:
            entry = self.rpending[job_id] = (tier, [])
        kept = entry[1]
        kept.append((estimate_class(point_s), now_ms, point_s, 1.0))
        if len(kept) > KEEP_REFRESHES:
            _merge_oldest(kept)

    def told(self, job_id: str, p50_s: float) -> None:
        """The P50 a queued job was told at admission, scored at its start
        (module doc, 11.); a P50 of 0 ("starts now") is not. O(1)."""
        if p50_s > 0 and self.enabled:
            self.told50[job_id] = p50_s

    def forget(self, job_id: str) -> None:
        self.told50.pop(job_id, None)
        self.pending.pop(job_id, None)
        self.rpending.pop(job_id, None)

    def censor(self, now_ms: int) -> None:
        """Count the queued jobs as right-censored observations at their wait
        so far, for the Kaplan-Meier quantiles (module doc, 3.). O(pending +
        kept refreshes + histograms), ~0.8 us an entry; run on the estimate
        cadence, not per event. A fleet cell (multitenant, 125 nodes, production
        cadences) keeps ~230 queued jobs and, with ``KEEP_REFRESHES``, ~1,500
        refreshes: ~5 % of its CPU."""
        if not self.enabled:
            return
        hists = self.hists
        # per (tier, class, refresh): the histograms it counts into, and its
        # censored jobs by bucket, in one pass with one call per entry (this
        # runs over every queued job and every kept refresh on each estimate
        # cadence; a closure per entry on top of ``_bucket`` was ~10 % of it)
        groups: dict[tuple[str, int, bool], dict[int, float]] = {}
        # the classes that wait themselves, in their own frame (7.); the tier's
        # pool still counts those entries in the point's, through ``groups``
        own_frame: dict[tuple[str, int], dict[int, float]] = {}
        log2, floor, bucket = math.log2, FLOOR_S, _bucket
        for tier, since_ms, point_s, cls in self.pending.values():
            key = (tier, cls, False)
            group = groups.setdefault(key, {})
            waited_s = max(0.0, (now_ms - since_ms) / 1000)
            i = bucket(log2((waited_s + floor) / (point_s + floor)))
            group[i] = group.get(i, 0.0) + 1.0
            if waits_itself(cls):
                own_floor, base = frame(key[:2], point_s)
                group = own_frame.setdefault(key[:2], {})
                i = bucket(log2((waited_s + own_floor) / base))
                group[i] = group.get(i, 0.0) + 1.0
            elif cls:  # its waits in their own frame too (10.)
                group = own_frame.setdefault((tier, WAIT + cls), {})
                i = bucket(log2((waited_s + WAIT_FLOOR_S) / WAIT_FLOOR_S))
                group[i] = group.get(i, 0.0) + 1.0
        for tier, seen in self.rpending.values():
            last_cls = -1  # a job's refreshes mostly share a class: one lookup for a run
            for cls, since_ms, point_s, weight in seen:
                if cls != last_cls:
                    last_cls = cls
                    group = groups.setdefault((tier, cls, True), {})
                waited_s = max(0.0, (now_ms - since_ms) / 1000)
                i = bucket(log2((waited_s + floor) / (point_s + floor)))
                group[i] = group.get(i, 0.0) + weight
        extra: dict[tuple[str, int], dict[int, float]] = dict(own_frame)
        for (tier, cls, refresh), group in groups.items():
            for hist_key in _keys(tier, cls, refresh):
                if hist_key in hists and hist_key not in own_frame:
                    buckets = extra.setdefault(hist_key, {})
                    for i, n in group.items():
                        buckets[i] = buckets.get(i, 0.0) + n
        for hist_key, hist in hists.items():
            hist.set_censored(extra.get(hist_key, {}))

    def started(self, job_id: str, now_ms: int) -> None:
        """A job's first start: learn from its admission estimate and from its
        published refreshes."""
        entry = self.pending.pop(job_id, None)
        refreshes = self.rpending.pop(job_id, None)
        told50 = self.told50.pop(job_id, None)
        if not self.enabled:
            return
        if entry is not None:
            tier, admitted_ms, point_s, cls = entry
            if told50 is not None:
                # its wait as the band was told (8.): a start on a Tick's pass
                # waited half a Tick less than the cell's clock says
                lag_ms = self.tick_ms // 2 if self.in_tick else 0
                hit = (now_ms - admitted_ms - lag_ms) / 1000 <= told50
                adj = self.p50_adj.get(tier, 0.0) + (-0.5 if hit else 0.5) * P50_STEP
                self.p50_adj[tier] = min(P50_ADJ_LIMIT, max(-P50_ADJ_LIMIT, adj))
            own = wait_class(cls)
            if own is not None:
                # a start on a Tick's pass waited half a Tick less than the
                # cell's clock says, on average; one on another input, as much
                since_ms = admitted_ms + (self.tick_ms // 2 if self.in_tick else 0)
                self._score_frames(tier, cls, own, point_s, (now_ms - since_ms) / 1000)
                self._learn(tier, since_ms, now_ms, WAIT_FLOOR_S, own, False, keys=((tier, own),))
            self._learn(tier, admitted_ms, now_ms, point_s, cls, False)
        if refreshes is not None:
            tier, seen = refreshes
            for cls, at_ms, point_s, weight in seen:
                self._learn(tier, at_ms, now_ms, point_s, cls, True, weight)

    def _learn(
        self,
        tier: str,
        since_ms: int,
        now_ms: int,
        point_s: float,
        cls: int,
        refresh: bool,
        weight: float = 1.0,
        keys: tuple[tuple[str, int], ...] | None = None,
    ) -> None:
        actual_s = max(0.0, (now_ms - since_ms) / 1000)
        for key in keys or _keys(tier, cls, refresh):
            floor, base = frame(key, point_s)
            log_ratio = math.log2((actual_s + floor) / base)
            hist = self.hists.get(key)
            if hist is None:
                hist = self.hists[key] = Histogram()
            hist.add(log_ratio, weight, REFRESH_HALVE_AT if refresh else HALVE_AT)

    def _score_frames(self, tier: str, cls: int, own: int, point_s: float, actual_s: float) -> None:
        """Score the two frames of an admission class on one start (module doc,
        10.): the pinball losses of the bands each would tell the job now, the
        point's (its class, the pool or the depth prior one job deep, as
        ``multipliers`` reads it) less the waits'. Nothing before the waits'
        histogram has ``MIN_SAMPLES``. O(1) with cached quantiles."""
        hist = self.hists.get((tier, own))
        if hist is None or hist.total < MIN_SAMPLES:
            return
        actual_s = max(0.0, actual_s)
        loss = [0.0] * len(QUANTILES)
        for sign, m, key in (
            (-1.0, hist.multipliers(), (tier, own)),
            (1.0, *self._point_multipliers(tier, cls)),
        ):
            floor, base = frame(key, point_s)
            for i, (q, mq) in enumerate(zip(QUANTILES, m)):
                told = max(0.0, base * mq - floor)
                loss[i] += sign * (
                    q * (actual_s - told) if actual_s > told else (1 - q) * (told - actual_s)
                )
        score = self.frame_score
        old = score.get((tier, cls), (0.0,) * len(QUANTILES))
        score[(tier, cls)] = tuple(FRAME_MEMORY * o + x for o, x in zip(old, loss))

    def _point_multipliers(
        self, tier: str, cls: int
    ) -> tuple[tuple[float, float], tuple[str, int] | None]:
        """The point frame's (m50, m90) for an admission class and the key read."""
        for key in _keys(tier, cls):
            hist = self.hists.get(key)
            if hist is not None and hist.total >= MIN_SAMPLES:
                return hist.multipliers(), key
        return PRIOR, None


def _merge_oldest(kept: list[tuple[int, int, float, float]]) -> None:
    """Fold one of a job's kept refreshes into another: of each refresh and the
    next one of its class, the pair whose heavier weight is smallest (the
    oldest such), kept as the older with both weights. Like a binary counter
    per class: recent refreshes weigh 1 or 2, older ones stand for 4, 8, ...
    of their neighbours, so every published refresh still counts once and a
    job keeps at most ``KEEP_REFRESHES``. With more kept than there are
    estimate classes (7) two share one. O(KEEP_REFRESHES**2)."""
    best: tuple[float, int, int] | None = None
    for i, older in enumerate(kept):
        for j in range(i + 1, len(kept)):
            newer = kept[j]
            if newer[0] == older[0]:
                heavier = max(older[3], newer[3])
                if best is None or heavier < best[0]:
                    best = (heavier, i, j)
                break
    if best is not None:
        _, i, j = best
        older, newer = kept[i], kept[j]
        kept[i] = (older[0], older[1], older[2], older[3] + newer[3])
        del kept[j]


def _keys(tier: str, cls: int, refresh: bool = False) -> tuple[tuple[str, int], ...]:
    """The histograms a (tier, estimate class) learns into and reads from, most
    specific first: class 0 ("starts now") only its own; admissions their class
    and the tier's (-1); refreshes only their class + ``REFRESH`` (module doc, 6.)."""
    if refresh:
        return ((tier, REFRESH + cls),)
    return ((tier, cls), (tier, -1)) if cls else ((tier, 0),)
