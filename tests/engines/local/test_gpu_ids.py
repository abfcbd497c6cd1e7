"""Which GPU ids tasks and actors get (``engines/local/gpus.py``), without processes."""

from __future__ import annotations

from lightwork.engines.local.gpus import GpuIds
from lightwork.engines.local.scheduler import PlacementGroupState
from lightwork.kernel.resources import group_shape, make_shape


def _group(hex_id: str, bundles: list[dict[str, float]]) -> PlacementGroupState:
    return PlacementGroupState(1, hex_id, "", bundles, "PACK")


def test_whole_gpus_are_taken_most_free_first_and_given_back():
    gpus = GpuIds(2)
    assert gpus.assign(1, make_shape({"CPU": 1, "GPU": 0.5})) == (0,)
    assert gpus.assign(2, make_shape({"GPU": 1})) == (1,)  # GPU 0 is half taken
    assert gpus.assign(3, make_shape({"GPU": 0.5})) == (0,)
    gpus.release(1)
    gpus.release(3)
    assert gpus.assign(4, make_shape({"GPU": 1})) == (0,)


def test_no_gpus_means_no_ids_and_no_bookkeeping():
    gpus = GpuIds(0)
    assert not gpus.any
    assert gpus.assign(1, make_shape({"CPU": 1})) == ()
    assert gpus.held == {}


def test_a_task_dispatched_again_does_not_keep_its_first_share():
    gpus = GpuIds(1)
    shape = make_shape({"GPU": 1})
    assert gpus.assign(7, shape) == (0,)
    assert gpus.assign(7, shape) == (0,)  # requeued and dispatched again
    gpus.release(7)
    assert gpus.node.free == {0: 1.0}


def test_a_bundle_keeps_its_gpu_and_outsiders_get_the_others():
    gpus = GpuIds(3)
    group = _group("ab12", [{"CPU": 1}, {"GPU": 1}])
    gpus.reserve_group(group)
    inside = group_shape(make_shape({"GPU": 1}), "ab12", 1)
    (bundle_gpu,) = gpus.assign(1, inside)
    gpus.release(1)
    assert gpus.assign(2, inside) == (bundle_gpu,)
    outside = {gpus.assign(3, make_shape({"GPU": 1})), gpus.assign(4, make_shape({"GPU": 1}))}
    assert outside == {(i,) for i in range(3) if i != bundle_gpu}
    assert gpus.assign(5, make_shape({"GPU": 1})) == ()  # none left outside the group


def test_a_group_wide_task_takes_from_any_bundle_with_room():
    gpus = GpuIds(2)
    gpus.reserve_group(_group("cd34", [{"GPU": 1}, {"GPU": 1}]))
    anywhere = group_shape(make_shape({"GPU": 1}), "cd34", -1)
    assert {gpus.assign(1, anywhere), gpus.assign(2, anywhere)} == {(0,), (1,)}


def test_removing_a_group_gives_its_gpus_back_now_or_when_their_holder_ends():
    gpus = GpuIds(2)
    gpus.reserve_group(_group("ef56", [{"GPU": 1}, {"GPU": 1}]))
    (held,) = gpus.assign(1, group_shape(make_shape({"GPU": 1}), "ef56", 0))
    gpus.remove_group("ef56")
    assert gpus.node.free == {held: 0.0, 1 - held: 1.0}
    gpus.release(1)
    assert gpus.node.free == {0: 1.0, 1: 1.0}
