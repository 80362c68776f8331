"""The launch counter: how ops map to launches, syncs and copies on meta tensors standing for the GPU."""

import torch
from torch import nn

from torchtune.training.estimate import _launch_counter as lc

DEVICE = lc.DEVICE


def _count(fn):
    counter = lc.LaunchCounter()
    with lc.counting(counter):
        fn(counter)
    return counter.count()


def test_kernels_views_and_allocations():
    def step(counter):
        a = torch.empty(64, 64, device=DEVICE)  # allocation: no launch
        b = a.view(-1).view(64, 64).t()  # views: none
        c = a @ b  # one GEMM
        c.add_(1.0)  # one elementwise kernel
        c.to(torch.bfloat16).float()  # two casts: copies
        torch.zeros(3, device=DEVICE)  # one fill

    c = _count(step)
    assert c.launches == {"optimizer": 0, "rounding": 0, "attention": 0, "norm": 0, "copy": 2, "other": 3}
    assert c.syncs == 0


def test_host_work_is_not_a_launch_and_reads_of_device_values_are_syncs():
    def step(counter):
        host = torch.arange(10)
        assert int(host.sum()) == 45  # host tensors run for real
        t = torch.zeros(3, device=DEVICE)
        t.sum().item()  # one sync
        t.tolist()  # one sync for the whole list
        float(t[0])  # one more
        f"{t[1]}"  # formatting a device tensor reads it
        t.nonzero()  # a shape that depends on device data

    c = _count(step)
    assert c.syncs == 5, c.host_syncs
    assert c.launches["other"] == 3  # zeros, sum, nonzero


def test_host_to_device_copies_pinned_and_pageable_and_device_to_host_reads():
    def step(counter):
        batch = torch.ones(2, 8, dtype=torch.long)
        pinned = torch.ones(2, 8, dtype=torch.long)
        counter.mark_pinned(pinned)
        batch.to(DEVICE, non_blocking=True)
        pinned.to("cuda", non_blocking=True)
        device = torch.ones(3, device=DEVICE)
        device.cpu()  # a blocking read

    c = _count(step)
    assert (c.h2d_pageable, c.h2d_pinned, c.d2h) == (1, 1, 1)
    assert c.launches["copy"] == 3 and c.launches["other"] == 1 and c.syncs == 1  # + the fill


class _Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(8, device=DEVICE))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale


def test_kinds_follow_modules_into_backward_and_optimizer_hooks():
    def step(counter):
        norm, linear = _Norm(), nn.Linear(8, 8, bias=False, device=DEVICE)
        opt = torch.optim.SGD(linear.parameters(), lr=0.1)
        linear.weight.register_post_accumulate_grad_hook(lambda p: (opt.step(), opt.zero_grad()))
        x = torch.ones(4, 8, device=DEVICE, requires_grad=True)
        counter.reset()
        linear(norm(x)).sum().backward()

    c = _count(step)
    assert c.launches["norm"] >= 10  # pow, mean, add, rsqrt, muls and their gradients
    assert c.launches["optimizer"] >= 1 and c.optimizer_params == 1
    assert c.launches["other"] >= 3  # the GEMM forward, its two backward GEMMs (minus the input's), the sum


def test_declared_regions_count_as_their_kernels():
    def step(counter):
        t = torch.ones(1024, device=DEVICE)
        with lc.kernel_region("rounding", launches=1):
            for _ in range(5):
                t = t * 2  # placeholder ops of a compiled kernel: not counted
        with lc.kernel_region("rounding"):
            t.add_(1)  # counted, as rounding

    c = _count(step)
    assert c.launches["rounding"] == 2 and c.total == 3  # + the fill


def test_stream_stand_ins_count_host_waits_and_gpu_waits_apart():
    def step(counter):
        with lc.simulated_cuda_streams():
            s = torch.cuda.Stream()
            event = s.record_event()
            torch.cuda.current_stream().wait_event(event)  # on the GPU
            event.synchronize()  # the host waits
            torch.cuda.synchronize()

    c = _count(step)
    assert c.syncs == 2 and c.stream_waits == 1
