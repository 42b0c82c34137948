"""Third-party vision models as their libraries ship them: trace, solve, apply onto the model, one real step.

Not part of ``make bench``: it needs torchvision, timm, monai and
segmentation-models-pytorch, which this project does not depend on. In a
throwaway venv (the PyPI torchvision wheel's C ops need a CUDA torch; its
Python models do not, so ``torchvision/_meta_registrations.py`` can be
emptied there)::

    python -m venv /tmp/tpv && /tmp/tpv/bin/pip install -c constraints.txt torch==2.13.0 \
        torchvision timm monai segmentation-models-pytorch transformers networkx ortools numpy numba
    PYTHONPATH=. B=4 S=96 /tmp/tpv/bin/python benchmarks/thirdparty_vision.py 0.5 tv-mobilenet_v2 monai-basicunet

Arguments: the budget fraction, then model names (default: all). ``B`` and
``S``: batch and image side. Prints one line per model: nodes, spans,
regions, status, store-all, budget, predicted, counted (tensor storages) and
allocator (profiler) peaks, whether the allocator's peak fits the budget and
whether gradients and buffers are bitwise those of the unplanned step.
"""

import os, sys, time, torch, torch.nn.functional as F, scheduler, solvers
from scheduler.tracing.tracer import capture
from scheduler.measuring.storages import measure_step
from scheduler.measuring.profiler import profile_step
from solvers import simulate
torch.set_num_threads(2)
def tv(name, **kw):
    import torchvision.models as M
    return getattr(M, name)(**kw)
def seg(name):
    import torchvision.models.segmentation as S
    return getattr(S, name)(weights=None, weights_backbone=None, num_classes=3, aux_loss=False)
def timm_(name, **kw):
    import timm; return timm.create_model(name, pretrained=False, **kw)
def monai_unet():
    from monai.networks.nets import BasicUNet
    return BasicUNet(spatial_dims=2, in_channels=3, out_channels=2, features=(8, 8, 16, 32, 64, 8))
def smp_unet():
    import segmentation_models_pytorch as smp
    return smp.Unet("resnet18", encoder_weights=None, classes=2)
MODELS = {
 "tv-resnet50": (lambda: tv("resnet50", num_classes=10), "cls", 64),
 "tv-mobilenet_v2": (lambda: tv("mobilenet_v2", num_classes=10), "cls", 64),
 "tv-densenet121": (lambda: tv("densenet121", num_classes=10), "cls", 64),
 "tv-efficientnet_b0": (lambda: tv("efficientnet_b0", num_classes=10), "cls", 64),
 "tv-fcn_resnet50": (lambda: seg("fcn_resnet50"), "segout", 64),
 "timm-resnet50": (lambda: timm_("resnet50", num_classes=10, drop_path_rate=0.1), "cls", 64),
 "timm-efficientnet_b0": (lambda: timm_("efficientnet_b0", num_classes=10, drop_path_rate=0.2), "cls", 64),
 "monai-basicunet": (monai_unet, "seg", 64),
 "smp-unet": (smp_unet, "seg", 64),
}
def loss_for(kind):
    if kind == "cls": return lambda out: F.cross_entropy(out, torch.zeros(out.shape[0], dtype=torch.long))
    if kind == "segout": return lambda out: out["out"].float().pow(2).mean()
    return lambda out: out.float().pow(2).mean()
frac = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
names = sys.argv[2:] or list(MODELS)
for name in names:
    make, kind, size = MODELS[name]
    torch.manual_seed(0)
    model = make().train()
    x = torch.randn(int(os.environ.get("B", 4)), 3, int(os.environ.get("S", size)), int(os.environ.get("S", size)))
    loss = loss_for(kind)
    t0 = time.perf_counter()
    try:
        g = capture(model, (x,), {}, loss=loss, workspaces=os.environ.get("WS", "auto")).graph
        store = simulate(g).peak_bytes
        budget = solvers.activation_budget_bytes(g, frac)
        plan = scheduler.solve(g, budget, solver="ilp", time_limit_s=60)
        pred = simulate(g, plan).peak_bytes
        bufs = [b.clone() for b in model.buffers()]
        def reset():
            with torch.no_grad():
                for b, s in zip(model.buffers(), bufs): b.copy_(s)
            for p in model.parameters(): p.grad = None
        def step():
            torch.manual_seed(0); l = loss(model(x)); l.backward(); return l.detach()
        reset(); l0 = step(); g0 = [p.grad.clone() for p in model.parameters() if p.grad is not None]; b0=[b.clone() for b in model.buffers()]
        reset(); scheduler.apply(model, plan); l1 = step(); g1 = [p.grad.clone() for p in model.parameters() if p.grad is not None]; b1=[b.clone() for b in model.buffers()]
        eq = torch.equal(l0,l1) and len(g0)==len(g1) and all(torch.equal(a,b) for a,b in zip(g0,g1)) and all(torch.equal(a,b) for a,b in zip(b0,b1))
        reset()
        live = list(model.parameters()) + list(model.buffers()) + [x]
        base = sum(t.untyped_storage().nbytes() for t in {t.untyped_storage().data_ptr(): t for t in live}.values())
        reset(); torch.manual_seed(0); alloc = profile_step(lambda: (loss(model(x)).backward()), baseline_bytes=base).peak_bytes
        reset(); torch.manual_seed(0); counted = measure_step(model, (x,), {}, loss=loss).peak_bytes
        print(f"{name}: nodes {len(g)} spans {len(g.spans)} regions {len(plan.regions)} status {plan.status} store-all {store} budget {budget} pred {pred} counted {counted} alloc {alloc} fits_alloc {alloc <= budget} grads_equal {eq} {time.perf_counter()-t0:.0f}s", flush=True)
    except Exception as exc:
        import traceback; traceback.print_exc(limit=3)
        print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
