#!/usr/bin/env python3
"""A PyTorch peer for our trainer's fully connected networks (models/mnist-mlp.cfg): the same
darknet cfg, the same layers, loss and SGD, timed as full training steps, so our images/s on the
MLP has a yardstick (tools/cpu_vs_torch.sh runs both side by side). A benchmark, never a
dependency, like tools/peer/torch_yolov3.py, whose cfg reader it shares.

What it builds (graph/graph.cpp's semantics):
  [net]        inputs= (the flattened input size), batch, learning_rate, momentum, decay
  [connected]  a linear layer of output= units (with bias), then activation= relu, leaky (0.1),
               logistic or linear
  [softmax]    softmax over the last layer's outputs, with cross-entropy against the labels
               (summed over the batch; the optimizer divides the learning rate by the batch, as
               darknet and ours do)
The optimizer is darknet's SGD: momentum, decay on the weights.

A step = forward, loss, backward, optimizer step, on one fixed batch of random inputs (uniform
[0, 1]) and random labels (fixed seed) in memory: no data loading is in it.

Example:
  python3 tools/peer/torch_mlp.py --cfg models/mnist-mlp.cfg --threads 2
Output: `peer: fp32 <images/s> img/s (<ms> ms/step) [cpu]`.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch
    import torch.nn as nn
    from torch_yolov3 import CfgError, Opts, read_cfg
except ImportError as e:  # the peer is optional: say what is missing, plainly
    print(f"peer: unavailable: {e} (needs python3 with torch and numpy)", file=sys.stderr)
    sys.exit(3)

ACTIVATIONS = {"relu": nn.ReLU, "leaky": lambda: nn.LeakyReLU(0.1), "logistic": nn.Sigmoid, "linear": nn.Identity}


def build(path):
    """(net parameters, nn.Sequential of the [connected] layers, whether a [softmax] ends it)."""
    sections = read_cfg(path)
    if not sections or sections[0]["type"] not in ("net", "network"):
        raise CfgError(f"{path}: the first section must be [net]")
    n = Opts(path, sections[0])
    net = {"inputs": n.int("inputs", 0), "batch": n.int("batch", 1), "learning_rate": n.float("learning_rate", 0.001),
           "momentum": n.float("momentum", 0.9), "decay": n.float("decay", 0.0005)}
    if net["inputs"] < 1:
        n.fail("inputs= (the flattened input size) is missing")
    layers, width, softmax = [], net["inputs"], False
    for s in sections[1:]:
        o = Opts(path, s)
        if softmax:
            o.fail("comes after [softmax], which must be last")
        if s["type"] in ("connected", "conn"):
            act = o.str("activation", "logistic")
            if act not in ACTIVATIONS:
                o.fail(f"activation={act} is not one of {', '.join(ACTIVATIONS)}")
            out = o.int("output", 1)
            layers += [nn.Linear(width, out), ACTIVATIONS[act]()]
            width = out
        elif s["type"] == "softmax":
            softmax = True
        else:
            o.fail("is not a layer this peer builds ([connected], [softmax])")
    return net, nn.Sequential(*layers), softmax


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cfg", default="models/mnist-mlp.cfg")
    ap.add_argument("--batch", type=int, default=0, help="images per step (the cfg's batch)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for torch (its default)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (3)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps (20)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    try:
        net, model, softmax = build(args.cfg)
    except CfgError as e:
        print(f"peer: {e}", file=sys.stderr)
        return 2
    batch = args.batch or net["batch"]
    classes = model[-2].out_features
    x = torch.rand(batch, net["inputs"])
    labels = torch.randint(0, classes, (batch,))
    decay = [p for name, p in model.named_parameters() if name.endswith("weight")]
    rest = [p for name, p in model.named_parameters() if not name.endswith("weight")]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": net["decay"] * batch}, {"params": rest}],
                          lr=net["learning_rate"] / batch, momentum=net["momentum"])
    loss_fn = nn.CrossEntropyLoss(reduction="sum") if softmax else lambda out, _: 0.5 * (out * out).sum()

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(x), labels)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = (time.perf_counter() - start) / args.steps
    print(f"peer: fp32 {batch / seconds:.1f} img/s ({seconds * 1e3:.2f} ms/step) [cpu, {torch.get_num_threads()} "
          f"threads, torch {torch.__version__}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
