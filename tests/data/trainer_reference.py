# Prints the reference values in tests/test_trainer_reference.c: PyTorch (float64) forward
# results of the engine's ops on fixed inputs. Run: /usr/bin/python3 tests/data/trainer_reference.py
import torch, torch.nn.functional as F
torch.set_default_dtype(torch.float64)
x = torch.tensor([[0.5, -1.25, 2.0, 0.0], [-0.75, 1.5, -2.5, 3.0], [1.0, 0.25, -0.5, -1.5]])
w = torch.tensor([[0.2, -0.1, 0.4, 0.3], [-0.5, 0.6, 0.1, -0.2]])
b = torch.tensor([0.05, -0.15])
labels = torch.tensor([2, 0, 3])
g = torch.tensor([1.5, 0.5, -1.0, 2.0]); beta = torch.tensor([0.1, -0.2, 0.3, 0.0])
img = torch.arange(2*2*4*4, dtype=torch.float64).reshape(2, 2, 4, 4).sin()
k = torch.arange(3*2*3*3, dtype=torch.float64).reshape(3, 2, 3, 3).cos() * 0.5
kb = torch.tensor([0.1, -0.2, 0.3])
out = {
 "relu": F.relu(x), "gelu": F.gelu(x, approximate="tanh"), "tanh": torch.tanh(x),
 "sigmoid": torch.sigmoid(x), "exp": torch.exp(x), "log": torch.log(x.abs() + 0.5),
 "softmax": F.softmax(x, 1), "log_softmax0": F.log_softmax(x, 0),
 "cross_entropy": F.cross_entropy(x, labels).reshape(1),
 "linear": F.linear(x, w, b), "layer_norm": F.layer_norm(x, (4,), g, beta, 1e-5),
 "batch_norm": F.batch_norm(x, torch.zeros(4), torch.ones(4), g, beta, True, 0.1, 1e-5),
 "sum_axis0": x.sum(0), "mean_all": x.mean().reshape(1),
 "conv2d": F.conv2d(img, k, kb, stride=1, padding=1), "max_pool": F.max_pool2d(img, 2, 2),
 "avg_pool": F.avg_pool2d(img, 2, 2),
}
rm = torch.zeros(4); rv = torch.ones(4)
F.batch_norm(x, rm, rv, g, beta, True, 0.1, 1e-5)
out["bn_running_mean"] = rm; out["bn_running_var"] = rv
for name, t in out.items():
    vals = ", ".join("%.12g" % v for v in t.flatten().tolist())
    print(f"static const double ref_{name}[] = {{{vals}}};")
# tests/test_trainer_recipe.c: label smoothing and OneCycleLR. Its values were computed by
# hand from these definitions where no torch was installed; this prints PyTorch's to check.
print("label_smoothing 0.1, 0.25:",
      [F.cross_entropy(x, labels, label_smoothing=e).item() for e in (0.1, 0.25)])
opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=8, pct_start=3 / 8)
lrs = []
for i in range(8):
    lrs.append(opt.param_groups[0]["lr"])
    if i < 7:
        opt.step()
        sched.step()
print("one_cycle steps 0-7:", lrs)
