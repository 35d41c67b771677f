"""Where the builds run (clients/measurement.py, shares/pinning.py): off the core a GPU share's servers use."""
from tunekit.clients.measurement import Measurement, builder_cores
from tunekit.shares.pinning import measurement_cores


def test_builds_stay_off_the_core_a_gpu_shares_servers_launch_from():
    allowed = list(range(16))
    reserved = measurement_cores(allowed)
    assert reserved == [15]
    gpu = Measurement(fleets=[], device_kind="gpu", share_cores=reserved)
    assert builder_cores(gpu, overlap=True, allowed=allowed) == list(range(15))
    # measured with nothing building beside it (overlap off), the builds may take every core
    assert builder_cores(gpu, overlap=False, allowed=allowed) == allowed
    # on a small machine the builds need the core more: the servers are not pinned
    assert measurement_cores([0, 1]) is None
    assert builder_cores(Measurement(fleets=[], device_kind="gpu", share_cores=None), overlap=True,
                         allowed=[0, 1]) == [0, 1]
