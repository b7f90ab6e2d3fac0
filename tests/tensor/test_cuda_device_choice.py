"""Which GPU a rank uses (ndist.tensor._cuda.choose_device), as a pure function.

Inputs: the bound ``device_id``, the calling thread's current device, whether
the program chose a device, the launcher's local rank and the GPU count.
"""

import pytest

from ndist.tensor._cuda import choose_device


def test_bound_device_id_wins_over_everything():
    assert choose_device(2, current=1, chosen=True, local_rank=3, count=4) == (2, "device_id=cuda:2")


@pytest.mark.parametrize("bound", [4, -1, True, "1"])
def test_bound_device_out_of_range_or_not_an_int(bound):
    with pytest.raises(ValueError, match=r"device_id: expected a CUDA ordinal in \[0, 4\) \(4 visible GPU"):
        choose_device(bound, current=0, chosen=False, local_rank=None, count=4)


def test_launched_rank_without_a_choice_uses_local_rank_modulo_the_gpus():
    assert choose_device(None, current=0, chosen=False, local_rank=1, count=2)[0] == 1
    index, why = choose_device(None, current=0, chosen=False, local_rank=5, count=4)
    assert index == 1 and why == "LOCAL_RANK 5 % 4 visible GPU(s)"
    assert choose_device(None, current=0, chosen=False, local_rank=3, count=1)[0] == 0  # one GPU: all share it


def test_a_choice_of_the_program_is_kept():
    # set_device(0) on local rank 3: still device 0.
    assert choose_device(None, current=0, chosen=True, local_rank=3, count=4) == (0, "the current device")
    # A current device other than 0 was chosen (e.g. cupy.cuda.Device(2).use()).
    assert choose_device(None, current=2, chosen=False, local_rank=3, count=4) == (2, "the current device")


def test_not_launched_or_no_gpu_keeps_the_current_device():
    assert choose_device(None, current=0, chosen=False, local_rank=None, count=4) == (0, "the current device")
    assert choose_device(None, current=0, chosen=False, local_rank=2, count=0) == (0, "the current device")
