"""The rollout rule in the store (sql/0013), on every store: a stale file changes nothing."""

from __future__ import annotations

from datetime import timedelta

from actors.domain.generations import ConfigIdentity, Standing
from actors.ports import ReplicaStore
from actors.ports.messages import ConfigLoad, ConfigReport
from tests.contract.jobs import job

OLD = ConfigIdentity("0" * 64)
NEW = ConfigIdentity("1" * 64)


async def enabled(store: ReplicaStore) -> set[str]:
    return set(await store.active_jobs())


async def test_a_rolling_deploy_forward_then_a_stale_file_then_a_forced_rollback(
    store: ReplicaStore,
) -> None:
    first = await store.sync_config(ConfigLoad([job("a")], OLD), "r1")
    assert (first.standing, first.in_force.seq, dict(first.changes)) == (
        Standing.FIRST,
        1,
        {"a": "added"},
    )
    forward = await store.sync_config(ConfigLoad([job("a"), job("x")], NEW), "r2")
    assert (forward.standing, dict(forward.changes)) == (Standing.NEWER, {"x": "added"})
    assert forward.in_force.digest == NEW.digest
    # The replica still on the previous file: refused, x stays.
    stale = await store.sync_config(ConfigLoad([job("a")], OLD), "r1")
    assert (stale.standing, dict(stale.changes)) == (Standing.STALE, {})
    assert stale.in_force.digest == NEW.digest
    assert await enabled(store) == {"a", "x"}
    again = await store.sync_config(ConfigLoad([job("a"), job("x")], NEW), "r3")
    assert (again.standing, dict(again.changes), again.in_force.seq) == (Standing.IN_FORCE, {}, 2)
    # The operator's rollback: the old file is in force again, x removed.
    back = await store.sync_config(ConfigLoad([job("a")], OLD), "r1", force=True)
    assert (back.standing, dict(back.changes)) == (Standing.FORCED, {"x": "removed"})
    assert (back.in_force.seq, back.in_force.forced) == (3, True)
    assert await enabled(store) == {"a"}
    rollout = await store.config_rollout()
    assert [(g.seq, g.digest, g.forced) for g in rollout.generations] == [
        (3, OLD.digest, True),
        (2, NEW.digest, False),
        (1, OLD.digest, False),
    ]
    # Now the new file is the superseded one.
    assert (
        await store.sync_config(ConfigLoad([job("a"), job("x")], NEW), "r2")
    ).standing is Standing.STALE


async def test_a_lower_config_version_is_stale_and_a_higher_one_rolls_forward(
    store: ReplicaStore,
) -> None:
    await store.sync_config(ConfigLoad([job("a"), job("x")], ConfigIdentity(NEW.digest, 7)), "r1")
    lower = await store.sync_config(ConfigLoad([job("a")], ConfigIdentity("2" * 64, 6)), "r2")
    assert lower.standing is Standing.STALE
    assert await enabled(store) == {"a", "x"}
    higher = await store.sync_config(ConfigLoad([job("a")], ConfigIdentity(OLD.digest, 8)), "r2")
    assert (higher.standing, dict(higher.changes)) == (Standing.NEWER, {"x": "removed"})


async def test_replicas_report_their_file_and_a_clean_stop_forgets_it(
    store: ReplicaStore,
) -> None:
    ttl = timedelta(minutes=1)
    await store.report_config(ConfigReport("r1", NEW, False, "/etc/claimd.toml", ttl))
    await store.report_config(ConfigReport("r2", NEW, False, "/etc/claimd.toml", ttl))
    await store.report_config(ConfigReport("r3", OLD, True, "/etc/claimd.toml", ttl))
    rollout = await store.config_rollout()
    assert rollout.file_digests() == {NEW.digest: 2, OLD.digest: 1}
    assert [(r.replica, r.stale) for r in rollout.replicas] == [
        ("r1", False),
        ("r2", False),
        ("r3", True),
    ]
    await store.forget_config_replica("r3")
    assert (await store.config_rollout()).file_digests() == {NEW.digest: 2}
