import time, torch, torchvision
from opendnn.torch.compile_backend import OpendnnBackend
torch.backends.cudnn.benchmark = True
for train in (False, True):
    torch.manual_seed(0)
    m = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last).train(train)
    x = torch.randn(64, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    b = OpendnnBackend()
    cm = torch.compile(m, backend=b, options={"cudagraphs": True})
    def step():
        torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            y = cm(x)
        if train:
            y.float().sum().backward()
        return y
    t = time.time()
    for _ in range(3): step()
    torch.cuda.synchronize(); print("train" if train else "infer", "compile+3 steps", round(time.time() - t, 1), "s")
    print(" graphs", b.graphs, "regions", len(b.regions), "plans", len(b.plans), "captured", b.captured, "uncaptured", b.uncaptured[:4])
    print(" fallbacks", len(b.fallbacks), b.fallbacks[:6])
    engines = {}
    for p in b.plans:
        engines[p.engine] = engines.get(p.engine, 0) + 1
    print(" plan engines", engines)
    torch.cuda.synchronize(); t = time.time()
    for _ in range(10): step()
    torch.cuda.synchronize(); print(" step ms", round((time.time() - t) * 100, 2))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step(); torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
