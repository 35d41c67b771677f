"""Folding the tuning clients' results into one share's outcome (pure: dicts in, dicts out)."""
from __future__ import annotations


def fold_extra(outcome: dict, extra: dict) -> None:
    """Add a leftover round's trials to the shard's outcome (same tasks, by name)."""
    rows = {t["name"]: t for t in outcome["tasks"]}
    for row in extra["tasks"]:
        mine = rows.get(row["name"])
        if mine is None:
            continue
        base = mine["trials"]
        mine["trials"] += row["trials"]
        for when, measured in row.get("measured_at", []):  # the round's batches, counted on from the shard's trials
            mine.setdefault("measured_at", []).append([when, base + measured - row.get("resumed", 0)])
        mine["failed"] += row["failed"]
        mine["failed_build"] = mine.get("failed_build", 0) + row.get("failed_build", 0)
        for kind, line in row.get("first_errors", {}).items():
            mine.setdefault("first_errors", {}).setdefault(kind, line)
        mine["extra"] = mine.get("extra", 0) + row.get("extra", 0)
        mine["exhausted"] = row.get("exhausted", False)
        if row.get("fallback"):
            mine.setdefault("fallback", row["fallback"])
        fell = mine.setdefault("fell_at", [])
        reached = [us for us in (mine.get("tuned_us"), mine.get("untuned_us")) if us] + [p[1] for p in fell[-1:]]
        for point in row.get("fell_at", []):  # the round's falls below what the shard had reached
            if not reached or point[1] < min(reached):
                fell.append(point)
                reached = [point[1]]
        if row.get("tuned_us") and (mine.get("tuned_us") is None or row["tuned_us"] < mine["tuned_us"]):
            mine["tuned_us"] = row["tuned_us"]
            if mine.get("untuned_us"):
                mine["speedup"] = round(mine["untuned_us"] / mine["tuned_us"], 3)
    for key in ("trials_done", "trials_failed", "trials_cached"):
        outcome[key] += extra[key]


def sum_phases(phase_dicts: list[dict], wall_s: float, trials: int) -> dict:
    """The clients' phase times added up; the overhead fraction is over client-seconds, since the
    clients work at the same time."""
    totals: dict[str, float] = {}
    for phases in phase_dicts:
        for k, v in phases.get("total_s", {}).items():
            totals[k] = totals.get(k, 0.0) + v
    client_seconds = wall_s * max(1, len(phase_dicts))
    work = min(client_seconds, totals.get("build_s", 0) + totals.get("run_s", 0))
    return {"total_s": {k: round(v, 3) for k, v in totals.items()},
            "per_trial_s": {k: round(v / max(1, trials), 4) for k, v in totals.items()},
            "wall_s": round(wall_s, 3), "clients": len(phase_dicts),
            "overhead_fraction": round(1 - work / client_seconds, 3) if wall_s else None}


def coordinator_section(run, pool_status: dict, merged: dict, run_id: str, servers: int,
                        client_nodes: str = "any", last_grants: dict | None = None) -> dict:
    """report.json's "coordinator": clients and where they ran, fleets, each shard's tasks, budget
    and cost, the pool. `ran_on` has one row per start of a shard's client (node id, IP, cores it
    could use, Ray's CPUs of the node, build workers, pid): more than one when it was restarted."""
    plans = run.plans
    return {"clients": len(run.outcomes), "servers_per_device": servers, "client_nodes": client_nodes,
            "fleets": [{**{k: v for k, v in a.items() if k != "actor"},
                        "lost": a["actor"]._actor_id.hex() in run.lost_fleets} for a in run.addresses],
            "shards": [{"client": s, "tasks": [p.name for p in plans if p.client == s],
                        "budget": sum(p.budget for p in plans if p.client == s),
                        "estimated_cost": sum(p.cost for p in plans if p.client == s),
                        "trials": run.outcomes[s]["trials_done"],
                        "done_s": run.done_s.get(s),  # seconds from the start until this shard's client was done
                        # when its client's search began: what starting it cost (Ray actor, TVM import, build
                        # workers), which more GPUs do not shorten
                        "search_started_s": run.search_started_s.get(s),
                        # when it last drew trials from the pool: from there to done_s is its part of the tail
                        "last_draw_s": round(last_grants[str(s)] - run.started, 3)
                        if last_grants and str(s) in last_grants else None,
                        # its client was started and set up (TVM, engine, build workers) in the coordinator's
                        # warm-up, beside the untuned model, not in the tuning wall (false after a restart)
                        "ready_before_tuning": run.outcomes[s].get("ready_before_tuning"),
                        "hung_candidates": run.outcomes[s].get("hung_candidates", 0),
                        # its build workers' seconds per candidate, by phase (clients.build_profile)
                        "build_profile": run.outcomes[s].get("build_profile"),
                        # how full its pipeline was kept (depth, most and mean batches in flight): a client with
                        # fewer open tasks than the depth cannot fill it
                        "pipeline": (run.outcomes[s].get("phases") or {}).get("pipeline"),
                        "ran_on": run.placements.get(s, [])}
                       for s in sorted(run.outcomes)],
            # shards whose clients searched again for the pool's trials left after all were done (in the time left)
            "leftover_shards": run.leftover_shards,
            # reserve: what the pool held at the start (plan.reserve_trials); next to it, what tasks gave
            # back and, as returned, what dead clients had drawn and not measured
            "pool": {**pool_status, "reserve": run.reserve}, "merge": merged, "run_id": run_id, "client_restarts": run.client_restarts}
