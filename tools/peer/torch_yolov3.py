#!/usr/bin/env python3
"""A PyTorch peer for benchmarking our trainer: the same darknet cfg, the same network, the same
loss, timed the same way (full training steps), so our images/s has a yardstick.

It is a benchmark, never a dependency: nothing in the build or the tests imports it, and the
project runs without PyTorch. Python 3, torch and numpy only.

What it builds (semantics of graph/graph.cpp and kernels/*.h, NCHW tensors in channels_last
memory, i.e. NHWC like ours):
  [convolutional]  conv (padding size/2 when pad=1, else padding=), BatchNorm (eps 1e-5, running
                   statistics momentum 0.01: ours and darknet's GPU training) with the conv bias
                   folded into BN's beta as darknet does, activation leaky (0.1), relu, logistic
                   (darknet's default), linear
  [shortcut]       previous + from (activation linear only, as ours)
  [route]          channel concatenation of 1..n layers (negative = relative, else absolute)
  [upsample]       nearest neighbour by `stride`
  [maxpool]        darknet's padding: size-1 cells in all, (size-1)//2 before; out = (in-1)//stride+1
  [yolo]           the loss (below) on the preceding conv's raw outputs
The YOLO loss is darknet's yolo-layer formulation as kernels/yolo_loss.h states it (assignment to
the best of ALL anchors, the later truth winning a (cell, anchor), ignore_thresh, truth_thresh,
box weight 2 - w*h, BCE on x, y, objectness and classes, squared error on w, h; sums over the
batch, the optimizer dividing by the batch). `--loss sumsq` swaps in a stand-in (half the sum of
squares of the head outputs) for comparison; the output always says which loss ran.
The optimizer is darknet's SGD (kernels/sgd.h): momentum and decay from [net], decay on conv
weights only, the learning rate with darknet's burn-in (lr * (i/burn_in)^4).

A step = forward, loss, backward, optimizer step, on one fixed batch of random images (uniform
[0, 1]) and random boxes (fixed seed) that live on the device: unlike our trainer's timing, no
data loading or host-to-device copy is in it.

Examples:
  python3 tools/peer/torch_yolov3.py --cfg models/yolov3.cfg --classes 3          # GPU: 416, batch 16
  python3 tools/peer/torch_yolov3.py --cfg models/demo.cfg --size 160 --precisions fp32,bf16
  python3 tools/peer/torch_yolov3.py --cfg models/yolov3.cfg --summary            # layer table, like ours
  python3 tools/peer/torch_yolov3.py --cfg models/demo.cfg --weights runs/demo/last.weights \\
      --forward-check ref.npy [--forward-input input.npy]
  python3 tools/peer/torch_yolov3.py --cfg models/yolov3.cfg --classes 3 --precisions bf16 --compile
Output: one line per precision, `peer: <precision> <images/s> img/s (<ms> ms/step) [<device>]`
(<precision>+compile with --compile),
then one JSON line (starts with '{') with everything.
"""
import argparse
import copy
import json
import math
import os
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # the peer is optional: say what is missing, plainly
    print(f"peer: unavailable: {e} (needs python3 with torch and numpy)", file=sys.stderr)
    sys.exit(3)

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


class CfgError(Exception):
    pass


# ---- cfg ----------------------------------------------------------------------------------------

def read_cfg(path):
    """darknet cfg syntax: [section] headers, key=value lines, '#' and ';' comments."""
    sections = []
    with open(path) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].split(";", 1)[0].strip()
            if not line:
                continue
            if line.startswith("["):
                if not line.endswith("]"):
                    raise CfgError(f"{path}:{lineno}: bad section header {line!r}")
                sections.append({"type": line[1:-1].strip().lower(), "line": lineno, "opts": {}})
                continue
            key, sep, value = line.partition("=")
            if not sep or not sections:
                raise CfgError(f"{path}:{lineno}: expected key=value inside a section, got {line!r}")
            sections[-1]["opts"][key.strip()] = value.strip()
    return sections


class Opts:
    def __init__(self, path, section):
        self.where = f"{path}:{section['line']}"
        self.type = section["type"]
        self.o = section["opts"]

    def fail(self, why):
        raise CfgError(f"{self.where}: [{self.type}] {why}")

    def int(self, key, default=None):
        if key not in self.o:
            if default is None:
                self.fail(f"missing {key}=")
            return default
        try:
            return int(self.o[key])
        except ValueError:
            self.fail(f"{key}={self.o[key]} is not an integer")

    def float(self, key, default):
        try:
            return float(self.o[key]) if key in self.o else default
        except ValueError:
            self.fail(f"{key}={self.o[key]} is not a number")

    def ints(self, key):
        try:
            return [int(v) for v in self.o[key].split(",") if v.strip()]
        except ValueError:
            self.fail(f"{key}={self.o[key]} is not a list of integers")

    def floats(self, key):
        try:
            return [float(v) for v in self.o[key].split(",") if v.strip()]
        except ValueError:
            self.fail(f"{key}={self.o[key]} is not a list of numbers")

    def str(self, key, default):
        return self.o.get(key, default).strip().lower()


ACTIVATIONS = ("leaky", "linear", "relu", "logistic")


def parse_model(path, classes=None, size=None):
    """The typed model: net parameters and a list of layer dicts (absolute producer indices).
    classes: every [yolo]'s classes, and the conv before it len(mask)*(5+classes) filters."""
    sections = read_cfg(path)
    if not sections or sections[0]["type"] not in ("net", "network"):
        raise CfgError(f"{path}: the first section must be [net]")
    n = Opts(path, sections[0])
    net = {
        "width": n.int("width", 416), "height": n.int("height", 416), "channels": n.int("channels", 3),
        "batch": n.int("batch", 1), "momentum": n.float("momentum", 0.9), "decay": n.float("decay", 0.0005),
        "learning_rate": n.float("learning_rate", 0.001), "burn_in": n.int("burn_in", 0),
    }
    if size:
        net["width"] = net["height"] = size
    layers = []
    for s in sections[1:]:
        o = Opts(path, s)
        i = len(layers)

        def index(written, what):
            j = i + written if written < 0 else written
            if not 0 <= j < i:
                o.fail(f"{what} {written} of layer {i} points to layer {j}, outside 0..{i - 1}")
            return j

        t = s["type"]
        if t in ("convolutional", "conv"):
            k = o.int("size", 1)
            pad = o.int("pad", 0)
            layer = {"type": "conv", "filters": o.int("filters", 1), "size": k, "stride": o.int("stride", 1),
                     "pad": k // 2 if pad else o.int("padding", 0), "bn": bool(o.int("batch_normalize", 0)),
                     "activation": o.str("activation", "logistic")}
            if layer["activation"] not in ACTIVATIONS:
                o.fail(f"activation={layer['activation']} is not one of {', '.join(ACTIVATIONS)}")
            if o.int("groups", 1) != 1 or o.int("dilation", 1) != 1:
                o.fail("only groups=1 and dilation=1 are supported")
        elif t == "shortcut":
            if o.str("activation", "linear") != "linear":
                o.fail("only activation=linear is supported")
            layer = {"type": "shortcut", "inputs": [i - 1, index(o.int("from"), "from")]}
        elif t == "route":
            if "layers" not in o.o:
                o.fail("missing layers=")
            layer = {"type": "route", "inputs": [index(v, "layer") for v in o.ints("layers")]}
            if not layer["inputs"]:
                o.fail("layers= is empty")
        elif t == "upsample":
            layer = {"type": "upsample", "stride": o.int("stride", 2)}
        elif t == "maxpool":
            stride = o.int("stride", 1)
            k = o.int("size", stride)
            if o.int("padding", k - 1) != k - 1:
                o.fail("only padding = size-1 (darknet's default) is supported")
            layer = {"type": "maxpool", "size": k, "stride": stride}
        elif t == "yolo":
            num = o.int("num", 1)
            anchors = o.floats("anchors") if "anchors" in o.o else o.fail("missing anchors=")
            if len(anchors) != 2 * num:
                o.fail(f"{len(anchors)} anchor numbers, need 2*num = {2 * num}")
            mask = o.ints("mask") if "mask" in o.o else list(range(num))
            if any(not 0 <= m < num for m in mask) or len(set(mask)) != len(mask):
                o.fail(f"mask={mask} must be distinct indices below num={num}")
            layer = {"type": "yolo", "num": num, "anchors": [(anchors[2 * a], anchors[2 * a + 1]) for a in range(num)],
                     "mask": mask, "classes": o.int("classes", 20), "ignore_thresh": o.float("ignore_thresh", 0.5),
                     "truth_thresh": o.float("truth_thresh", 1.0)}
            if classes:
                layer["classes"] = classes
                if i == 0 or layers[i - 1]["type"] != "conv":
                    o.fail("--classes needs a [convolutional] right before each [yolo]")
                layers[i - 1]["filters"] = len(mask) * (5 + classes)
        else:
            o.fail("is not supported by the peer (conv, shortcut, route, upsample, maxpool, yolo)")
        layer["line"] = s["line"]
        layers.append(layer)
    return net, layers


def maxpool_out(n, k, s):
    return (n + (k - 1) - k) // s + 1  # kernels/maxpool.cpp: maxpool_output_size


def infer_shapes(net, layers, path="cfg"):
    """(c, h, w) per layer, with ours' checks; fills l['in'], l['out'], l['flops'], parameter counts."""
    shape_in = (net["channels"], net["height"], net["width"])
    out = []
    detection = False
    for i, l in enumerate(layers):
        prev = shape_in if i == 0 else out[i - 1]
        t = l["type"]
        l["weights"] = l["biases"] = l["scales"] = l["stats"] = 0
        l["flops"] = 0.0
        if t == "conv":
            c, h, w = prev
            k, s, p = l["size"], l["stride"], l["pad"]
            o = (l["filters"], (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1)
            if o[1] < 1 or o[2] < 1:
                raise CfgError(f"{path}:{l['line']}: conv has no output for input {prev}")
            l["weights"] = l["filters"] * k * k * c
            l["biases"] = l["filters"]
            l["scales"] = l["filters"] if l["bn"] else 0
            l["stats"] = 2 * l["filters"] if l["bn"] else 0
            l["flops"] = 2.0 * l["weights"] * o[1] * o[2]
        elif t == "shortcut":
            a, b = out[l["inputs"][0]], out[l["inputs"][1]]
            if a != b:
                raise CfgError(f"{path}:{l['line']}: [shortcut] adds {b} to {a}: the shapes must be equal")
            o = a
        elif t == "route":
            shapes = [out[j] for j in l["inputs"]]
            if any(s[1:] != shapes[0][1:] for s in shapes):
                raise CfgError(f"{path}:{l['line']}: [route] joins {shapes}: heights and widths must be equal")
            o = (sum(s[0] for s in shapes), shapes[0][1], shapes[0][2])
            prev = shapes[0]
        elif t == "upsample":
            o = (prev[0], prev[1] * l["stride"], prev[2] * l["stride"])
        elif t == "maxpool":
            o = (prev[0], maxpool_out(prev[1], l["size"], l["stride"]), maxpool_out(prev[2], l["size"], l["stride"]))
        elif t == "yolo":
            need = len(l["mask"]) * (5 + l["classes"])
            if prev[0] != need:
                raise CfgError(f"{path}:{l['line']}: [yolo] needs {need} input channels, layer {i - 1} gives "
                               f"{prev[0]} (set filters={need} there, or use --classes)")
            o = prev
            detection = True
        l["in"], l["out"] = prev, o
        out.append(o)
    if not detection:
        raise CfgError(f"{path}: no [yolo] layers: the peer trains detectors only")
    if net["width"] % 32 or net["height"] % 32:
        raise CfgError(f"{path}: input {net['width']}x{net['height']} must be a multiple of 32 for a detector")
    return out


def summary_table(net, layers):
    """Our `train_yolo --summary` table and totals (graph/graph.cpp's formats), to diff."""
    rows = ["%5s %-10s %7s %-13s %-16s    %-16s %9s" % ("layer", "type", "filters", "size/strd", "input", "output",
                                                       "BFLOPs")]
    hwc = lambda s: "%4d x%4d x%5d" % (s[1], s[2], s[0])
    names = {"conv": "conv", "shortcut": "shortcut", "route": "route", "upsample": "upsample",
             "maxpool": "max", "yolo": "yolo"}
    counts = {k: 0 for k in names}
    for i, l in enumerate(layers):
        t = l["type"]
        counts[t] += 1
        filters, size, inp = "", "", hwc(l["in"])
        if t == "conv":
            filters = str(l["filters"])
            size = f"{l['size']} x{l['size']} /{l['stride']}"
        elif t == "maxpool":
            size = f"{l['size']} x{l['size']} /{l['stride']}"
        elif t == "upsample":
            size = f"x{l['stride']}"
        elif t == "shortcut":
            inp = f"layer {l['inputs'][1]}"
        elif t == "route":
            inp = " ".join(str(j) for j in l["inputs"])
        rows.append("%5d %-10s %7s %-13s %-16s -> %-16s %9.3f" % (i, names[t], filters, size, inp, hwc(l["out"]),
                                                                   l["flops"] / 1e9))
    conv_flops = sum(l["flops"] for l in layers)
    trainable = sum(l["weights"] + l["biases"] + l["scales"] for l in layers)
    stats = sum(l["stats"] for l in layers)
    rows.append("%d layers (%d conv, %d shortcut, %d route, %d upsample, %d maxpool, %d yolo, 0 connected, 0 softmax) "
                "at %dx%dx%d" % (len(layers), counts["conv"], counts["shortcut"], counts["route"], counts["upsample"],
                                 counts["maxpool"], counts["yolo"], net["height"], net["width"], net["channels"]))
    rows.append("BFLOPs per image: %.3f in conv layers, %.3f in all" % (conv_flops / 1e9, conv_flops / 1e9))
    rows.append("parameters: %d trainable + %d BatchNorm running statistics = %d values in a .weights file"
                % (trainable, stats, trainable + stats))
    return "\n".join(rows)


# ---- the network --------------------------------------------------------------------------------

class ConvLayer(nn.Module):
    def __init__(self, cin, l):
        super().__init__()
        self.conv = nn.Conv2d(cin, l["filters"], l["size"], l["stride"], l["pad"], bias=not l["bn"])
        self.bn = nn.BatchNorm2d(l["filters"], eps=1e-5, momentum=0.01) if l["bn"] else None
        self.activation = l["activation"]

    def forward(self, x):
        x = self.conv(x)
        if self.bn is not None:
            x = self.bn(x)
        if self.activation == "leaky":
            return F.leaky_relu(x, 0.1, inplace=True)
        if self.activation == "relu":
            return F.relu(x, inplace=True)
        if self.activation == "logistic":
            return torch.sigmoid(x)
        return x


class MaxPool(nn.Module):
    """darknet's window: rows y*stride - (size-1)//2 .. + size-1, cells outside ignored."""

    def __init__(self, l, in_hw):
        super().__init__()
        k, s = l["size"], l["stride"]
        self.k, self.s, self.p = k, s, (k - 1) // 2
        want = [maxpool_out(n, k, s) for n in in_hw]
        # PyTorch's own padding (-inf, at most k/2 on both sides) gives the same windows when its
        # output count is ours; otherwise pad explicitly.
        def torch_out(n, ceil):
            span = n + 2 * self.p - k
            o = (-(-span // s) if ceil else span // s) + 1
            if ceil and (o - 1) * s >= n + self.p:
                o -= 1
            return o
        self.mode = None
        for ceil in (False, True):
            if [torch_out(n, ceil) for n in in_hw] == want:
                self.mode = ceil
                break

    def forward(self, x):
        if self.mode is not None:
            return F.max_pool2d(x, self.k, self.s, self.p, ceil_mode=self.mode)
        total = self.k - 1
        x = F.pad(x, (self.p, total - self.p, self.p, total - self.p), value=float("-inf"))
        return F.max_pool2d(x, self.k, self.s)


class Darknet(nn.Module):
    def __init__(self, net, layers):
        super().__init__()
        self.layers = layers
        shapes = infer_shapes(net, layers)
        mods = []
        for i, l in enumerate(layers):
            cin = net["channels"] if i == 0 else shapes[i - 1][0]
            if l["type"] == "conv":
                mods.append(ConvLayer(cin, l))
            elif l["type"] == "maxpool":
                mods.append(MaxPool(l, l["in"][1:]))
            else:
                mods.append(nn.Identity())
        self.mods = nn.ModuleList(mods)
        self.keep = set()
        for i, l in enumerate(layers):
            for j in l.get("inputs", []):
                if j != i - 1 or l["type"] == "route":
                    self.keep.add(j)
        self.heads = [i for i, l in enumerate(layers) if l["type"] == "yolo"]

    def forward(self, x):
        saved, heads = {}, []
        for i, l in enumerate(self.layers):
            t = l["type"]
            if t in ("conv", "maxpool"):
                x = self.mods[i](x)
            elif t == "shortcut":
                x = x + saved[l["inputs"][1]]
            elif t == "route":
                parts = [saved[j] for j in l["inputs"]]
                x = parts[0] if len(parts) == 1 else torch.cat(parts, 1)
            elif t == "upsample":
                x = F.interpolate(x, scale_factor=l["stride"], mode="nearest")
            elif t == "yolo":
                heads.append(x)
            if i in self.keep:
                saved[i] = x
        return heads

    def conv_layers(self):
        return [(i, self.mods[i]) for i, l in enumerate(self.layers) if l["type"] == "conv"]


def count_parameters(model):
    trainable = sum(p.numel() for p in model.parameters())
    stats = sum(m.bn.running_mean.numel() + m.bn.running_var.numel()
                for _, m in model.conv_layers() if m.bn is not None)
    return trainable, stats


# ---- darknet .weights ---------------------------------------------------------------------------

def load_darknet_weights(model, path):
    """graph/weights.h's format: int32 major, minor, revision; seen (uint64 when major*10+minor >= 2,
    else uint32); per conv layer: biases (BN beta), [scales (gamma), mean, variance], weights KCRS."""
    with open(path, "rb") as f:
        major, minor, revision = np.fromfile(f, dtype="<i4", count=3)
        seen = int(np.fromfile(f, dtype="<u8" if major * 10 + minor >= 2 else "<u4", count=1)[0])
        data = np.fromfile(f, dtype="<f4")
    need = sum(m.conv.weight.numel() + m.conv.out_channels * (4 if m.bn is not None else 1)
               for _, m in model.conv_layers())
    if data.size != need:
        raise ValueError(f"{path}: {data.size} floats after the header, the cfg's conv layers need {need}")
    pos = 0

    def take(t):
        nonlocal pos
        n = t.numel()
        t.copy_(torch.from_numpy(data[pos:pos + n].copy()).view_as(t))
        pos += n

    with torch.no_grad():
        for _, m in model.conv_layers():
            if m.bn is not None:
                for t in (m.bn.bias, m.bn.weight, m.bn.running_mean, m.bn.running_var):
                    take(t)
            else:
                take(m.conv.bias)
            take(m.conv.weight)  # PyTorch's OIHW is darknet's KCRS
    return {"major": int(major), "minor": int(minor), "revision": int(revision), "seen": seen}


def save_darknet_weights(model, path, seen=0):
    parts = [np.array([0, 2, 0], dtype="<i4").tobytes(), np.array([seen], dtype="<u8").tobytes()]
    for _, m in model.conv_layers():
        ts = [m.bn.bias, m.bn.weight, m.bn.running_mean, m.bn.running_var] if m.bn is not None else [m.conv.bias]
        for t in ts + [m.conv.weight]:
            parts.append(t.detach().float().cpu().contiguous().numpy().astype("<f4").tobytes())
    with open(path + ".tmp", "wb") as f:
        f.write(b"".join(parts))
    os.replace(path + ".tmp", path)


# ---- the YOLO loss ------------------------------------------------------------------------------

def box_iou(ax, ay, aw, ah, bx, by, bw, bh):
    """IoU of centre/size boxes, broadcasting (0 where there is no overlap or no area)."""
    iw = (torch.min(ax + aw / 2, bx + bw / 2) - torch.max(ax - aw / 2, bx - bw / 2)).clamp(min=0)
    ih = (torch.min(ay + ah / 2, by + bh / 2) - torch.max(ay - ah / 2, by - bh / 2)).clamp(min=0)
    inter = iw * ih
    union = aw * ah + bw * bh - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-30), torch.zeros_like(inter))


_HEAD_CONSTANTS = {}


def head_constants(l, dev):
    """A head's anchors (num, 2) in pixels, its mask, and anchor index -> mask index (-1 if not in
    the mask), made once per device (no host-to-device copies inside the step)."""
    key = (id(l), str(dev))
    if key not in _HEAD_CONSTANTS:
        anchors = torch.tensor(l["anchors"], dtype=torch.float32, device=dev)
        mask = torch.tensor(l["mask"], dtype=torch.long, device=dev)
        lut = torch.full((l["num"],), -1, dtype=torch.long)
        lut[torch.tensor(l["mask"])] = torch.arange(len(l["mask"]))
        _HEAD_CONSTANTS[key] = (anchors, mask, lut.to(dev), l)  # l kept: its id stays unique
    return _HEAD_CONSTANTS[key][:3]


def yolo_loss(out, l, truths, valid, net_w, net_h):
    """kernels/yolo_loss.h for one head. out: (N, A*(5+K), H, W) raw conv outputs; truths: (N, T, 5)
    [x, y, w, h, class] normalised; valid: (N, T) bool. Returns the loss summed over the batch, and
    its four parts. No host synchronisation (fixed shapes; unassigned truths go to a dummy slot)."""
    N, _, H, W = out.shape
    A, K = len(l["mask"]), l["classes"]
    dev = out.device
    p = out.float().view(N, A, 5 + K, H, W).permute(0, 1, 3, 4, 2)  # (N, A, H, W, 5+K)
    tx, ty, tw, th, to, tc = p[..., 0], p[..., 1], p[..., 2], p[..., 3], p[..., 4], p[..., 5:]
    anchors, mask, lut = head_constants(l, dev)
    aw_m = (anchors[mask, 0] / net_w).view(1, A, 1, 1)
    ah_m = (anchors[mask, 1] / net_h).view(1, A, 1, 1)
    gx = torch.arange(W, device=dev, dtype=torch.float32).view(1, 1, 1, W)
    gy = torch.arange(H, device=dev, dtype=torch.float32).view(1, 1, H, 1)
    x, y, w, h, cls = (truths[..., c] for c in range(5))  # (N, T)
    T = truths.shape[1]

    # Best IoU of every prediction with the valid truths of its image (no gradient through it).
    with torch.no_grad():
        bx = (gx + torch.sigmoid(tx)) / W
        by = (gy + torch.sigmoid(ty)) / H
        bw = torch.exp(tw) * aw_m
        bh = torch.exp(th) * ah_m
        e = lambda v: v.reshape(N, -1, 1)
        t = lambda v: v.view(N, 1, T)
        iou = box_iou(e(bx), e(by), e(bw), e(bh), t(x), t(y), t(w), t(h))
        iou = torch.where(valid.view(N, 1, T), iou, torch.full_like(iou, -1.0))
        best_iou, best_t = iou.max(-1)  # ties: the first truth
        best_iou = best_iou.view(N, A, H, W).clamp(min=0)
        best_t = best_t.view(N, A, H, W)

        P = N * A * H * W
        dummy = P  # where truths that this head does not train go
        # Assignment: the best of ALL anchors by width/height IoU (the first on ties), kept if masked.
        aw_all, ah_all = anchors[:, 0] / net_w, anchors[:, 1] / net_h
        inter = torch.min(w[..., None], aw_all) * torch.min(h[..., None], ah_all)
        best_n = (inter / (w[..., None] * h[..., None] + aw_all * ah_all - inter)).argmax(-1)
        a = lut[best_n]
        i = (x * W).floor().long().clamp(0, W - 1)
        j = (y * H).floor().long().clamp(0, H - 1)
        b = torch.arange(N, device=dev).view(N, 1)
        ok = valid & (a >= 0)
        key = torch.where(ok, ((b * A + a.clamp(min=0)) * H + j) * W + i, torch.full_like(i, dummy))
        order = torch.arange(T, device=dev).view(1, T).expand(N, T)
        # Two truths in one (cell, anchor): the later one wins.
        winner = torch.full((P + 1,), -1, dtype=torch.long, device=dev)
        winner.scatter_reduce_(0, key.reshape(-1), order.reshape(-1), reduce="amax")
        key = torch.where(ok & (winner[key] == order), key, torch.full_like(key, dummy)).reshape(-1)

        def scatter(values, base):
            flat = base.reshape(-1).clone()
            return torch.cat([flat, flat.new_zeros(1)]).scatter_(0, key, values.reshape(-1).to(flat.dtype))[:P] \
                .view(N, A, H, W)

        # truth_thresh (>= 1 disables): a prediction whose best IoU exceeds it is positive, with box
        # and class targets from that truth at its own cell and anchor. Assigned ones override.
        pick = lambda v: torch.gather(v, 1, best_t.view(N, -1)).view(N, A, H, W)
        zeros = torch.zeros(N, A, H, W, device=dev)
        if l["truth_thresh"] < 1:
            pos0 = best_iou > l["truth_thresh"]
            tx0, ty0 = pick(x) * W - gx, pick(y) * H - gy
            tw0 = torch.log(pick(w) / aw_m)
            th0 = torch.log(pick(h) / ah_m)
            k0, c0 = 2 - pick(w) * pick(h), pick(cls)
        else:
            pos0 = torch.zeros(N, A, H, W, dtype=torch.bool, device=dev)
            tx0 = ty0 = tw0 = th0 = k0 = c0 = zeros
        pos = scatter(torch.ones_like(x), pos0.float()) > 0
        a_ = a.clamp(min=0)
        tgt_x = scatter(x * W - i, tx0)
        tgt_y = scatter(y * H - j, ty0)
        tgt_w = scatter(torch.log(w * net_w / anchors[mask][a_, 0]), tw0)
        tgt_h = scatter(torch.log(h * net_h / anchors[mask][a_, 1]), th0)
        tgt_k = scatter(2 - w * h, k0)
        tgt_c = scatter(cls, c0).long()
        obj_term = pos | (best_iou <= l["ignore_thresh"])
        onehot = (tgt_c[..., None] == torch.arange(K, device=dev)).float()  # (no host sync, unlike one_hot)

    bce = lambda logits, target: F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    zero = torch.zeros((), device=dev)
    box = tgt_k * (bce(tx, tgt_x) + bce(ty, tgt_y) + 0.5 * (tw - tgt_w) ** 2 + 0.5 * (th - tgt_h) ** 2)
    box = torch.where(pos, box, zero).sum()
    obj_all = torch.where(obj_term, bce(to, pos.float()), zero)
    obj = torch.where(pos, obj_all, zero).sum()
    noobj = obj_all.sum() - obj
    cls_loss = torch.where(pos[..., None], bce(tc, onehot), zero).sum()
    return box + obj + noobj + cls_loss, torch.stack([box, obj, noobj, cls_loss]).detach()


def random_truths(n, t_max, classes, generator, device):
    """Fixed-seed random boxes: 1..t_max per image (about our shapes set's 3.4 on average for
    t_max 6), sizes 0.03..0.5 of the image, inside it."""
    counts = torch.randint(1, t_max + 1, (n,), generator=generator)
    wh = 0.03 + 0.47 * torch.rand(n, t_max, 2, generator=generator)
    xy = wh / 2 + (1 - wh) * torch.rand(n, t_max, 2, generator=generator)
    cls = torch.randint(0, classes, (n, t_max, 1), generator=generator).float()
    truths = torch.cat([xy, wh, cls], -1)
    valid = torch.arange(t_max).view(1, t_max) < counts.view(n, 1)
    return truths.to(device), valid.to(device)


# ---- timing -------------------------------------------------------------------------------------

def set_tf32(on):
    """fp32: no TF32 anywhere; otherwise TF32 for cuBLAS and cuDNN (PyTorch's own default for cuDNN)."""
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    return {"matmul_tf32": torch.backends.cuda.matmul.allow_tf32, "cudnn_tf32": torch.backends.cudnn.allow_tf32}


def make_optimizer(model, net):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if name.endswith("conv.weight") else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": net["decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.SGD(groups, lr=net["learning_rate"], momentum=net["momentum"], dampening=0)


def learning_rate(net, iteration):
    if net["burn_in"] and iteration < net["burn_in"]:
        return net["learning_rate"] * (iteration / net["burn_in"]) ** 4
    return net["learning_rate"]


def check_head_shapes(outs, heads, batch):
    """The forward pass's head outputs must have the shapes the cfg gives (ours)."""
    got = [tuple(o.shape) for o in outs]
    want = [(batch,) + tuple(l["out"]) for l in heads]
    if got != want:
        raise RuntimeError(f"head shapes (NCHW) {got} differ from the cfg's {want}")


def benchmark(precision, base_model, net, layers, images, truths, valid, args, device):
    cuda = device.type == "cuda"
    flags = set_tf32(precision != "fp32") if cuda else {}
    model = copy.deepcopy(base_model).to(device).to(memory_format=torch.channels_last).train()
    opt = make_optimizer(model, net)
    heads = [layers[i] for i in model.heads]
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = None
    if precision == "fp16":
        scaler = torch.amp.GradScaler("cuda") if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler") \
            else torch.cuda.amp.GradScaler()
    batch = images.shape[0]

    def forward_loss(x):
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            outs = model(x)
        if args.loss == "yolo":
            total, parts = zip(*(yolo_loss(o, l, truths, valid, net["width"], net["height"])
                                 for o, l in zip(outs, heads)))
            return sum(total), sum(parts), outs
        loss = sum(0.5 * o.float().pow(2).sum() for o in outs)
        return loss, loss.detach().view(1), outs

    # --compile: the forward pass and the loss as one compiled graph (its backward compiled with
    # it by AOTAutograd); the optimizer stays eager (foreach SGD).
    if args.compile:
        forward_loss = torch.compile(forward_loss, mode=args.compile)

    def step(iteration):
        for g in opt.param_groups:
            g["lr"] = learning_rate(net, iteration)
        opt.zero_grad(set_to_none=True)
        loss, parts, outs = forward_loss(images)
        if iteration == 0:
            check_head_shapes(outs, heads, batch)
        scaled = loss / batch  # our optimizer divides the summed gradients by the batch
        if scaler is not None:
            scaler.scale(scaled).backward()
            scaler.step(opt)
            scaler.update()
        else:
            scaled.backward()
            opt.step()
        return loss.detach(), parts

    # The first step compiles (--compile): timed apart, and not part of the warm-up's count.
    compile_s = None
    if args.compile:
        t0 = time.monotonic()
        step(0)
        if cuda:
            torch.cuda.synchronize()
        compile_s = time.monotonic() - t0
    for it in range(args.warmup):
        loss, parts = step(it)
    if cuda:
        torch.cuda.synchronize()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)]
        events[0].record()
        for it in range(args.steps):
            loss, parts = step(args.warmup + it)
            events[it + 1].record()
        events[-1].synchronize()
        per_step = [events[k].elapsed_time(events[k + 1]) for k in range(args.steps)]
    else:
        per_step = []
        for it in range(args.steps):
            t0 = time.perf_counter()
            loss, parts = step(args.warmup + it)
            per_step.append((time.perf_counter() - t0) * 1000)
    total_ms = sum(per_step)
    ms = total_ms / len(per_step)
    result = {"precision": precision + ("+compile" if args.compile else ""), "img_s": batch * len(per_step) / (total_ms / 1000), "ms_step": ms,
              "ms_median": sorted(per_step)[len(per_step) // 2], "ms_min": min(per_step),
              "loss_last": float(loss) / batch, "loss_parts_last": [float(v) / batch for v in parts]}
    result.update(flags)
    if scaler is not None:
        result["loss_scale"] = float(scaler.get_scale())
    if compile_s is not None:
        result["compile"] = args.compile
        result["compile_s"] = compile_s
    if cuda:
        result["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2 ** 30
        torch.cuda.reset_peak_memory_stats(device)
    del model, opt
    return result


# ---- forward check ------------------------------------------------------------------------------

def pattern_input(n, h, w, c=3):
    """The deterministic input when --forward-input is not given (easy to write anywhere):
    x[b, y, x, ch] = ((b*131 + y*31 + x*17 + ch*7) % 256) / 255, NHWC."""
    b, yy, xx, ch = np.meshgrid(np.arange(n), np.arange(h), np.arange(w), np.arange(c), indexing="ij")
    return (((b * 131 + yy * 31 + xx * 17 + ch * 7) % 256) / 255.0).astype(np.float32)


def forward_heads(model, net, net_layers, args, device):
    """One inference forward (BatchNorm on its running statistics, FP32, no TF32) of the NHWC
    input; the heads' raw outputs NHWC, flattened and concatenated in layer order."""
    if args.forward_input:
        x = np.load(args.forward_input).astype(np.float32)
        if x.ndim == 3:
            x = x[None]
    else:
        x = pattern_input(args.forward_batch, net["height"], net["width"], net["channels"])
    if x.shape[1:] != (net["height"], net["width"], net["channels"]):
        raise ValueError(f"forward input is {x.shape} (NHWC), the net takes "
                         f"N x {net['height']} x {net['width']} x {net['channels']}")
    if device.type == "cuda":
        set_tf32(False)
    m = model.to(device).eval()
    with torch.no_grad():
        outs = m(torch.from_numpy(x).to(device).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last))
    check_head_shapes(outs, [net_layers[i] for i in m.heads], x.shape[0])
    return [o.permute(0, 2, 3, 1).float().cpu().numpy() for o in outs], x.shape[0]


# ---- main ---------------------------------------------------------------------------------------

T0 = time.monotonic()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cfg", default="models/yolov3.cfg", help="darknet cfg (models/yolov3.cfg)")
    ap.add_argument("--classes", type=int, default=0,
                    help="set every [yolo]'s classes (and the conv before it: len(mask)*(5+classes) filters)")
    ap.add_argument("--size", type=int, default=0, help="input N x N (GPU: 416; CPU: 64; --summary: the cfg's)")
    ap.add_argument("--batch", type=int, default=0, help="images per step (GPU: 16; CPU: 2)")
    ap.add_argument("--precisions", default="",
                    help="comma-separated subset of fp32,tf32,bf16,fp16 (GPU: all; CPU: fp32,bf16)")
    ap.add_argument("--warmup", type=int, default=-1, help="untimed steps first (GPU: 5; CPU: 1)")
    ap.add_argument("--steps", type=int, default=-1, help="timed steps (GPU: 20; CPU: 3)")
    ap.add_argument("--loss", choices=("yolo", "sumsq"), default="yolo",
                    help="yolo: darknet's formulation (ours); sumsq: a stand-in, half the sum of squares of the heads")
    ap.add_argument("--max-boxes", type=int, default=6, help="random boxes per image: 1..N (6)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cuda, cuda:N, cpu")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for torch (its default)")
    ap.add_argument("--summary", action="store_true", help="print the layer table (ours' format) and exit")
    ap.add_argument("--weights", help="darknet .weights to start from")
    ap.add_argument("--save-weights", help="write the starting parameters as darknet .weights (and exit if no timing)")
    ap.add_argument("--forward-check", metavar="REF.npy",
                    help="compare one forward pass with a reference: the [yolo] heads' inputs NHWC, flattened and "
                         "concatenated in layer order (float32); relative norm per head")
    ap.add_argument("--forward-input", metavar="IN.npy",
                    help="the forward pass's input, N x H x W x C float32 in [0, 1] (default: pattern_input)")
    ap.add_argument("--forward-batch", type=int, default=1, help="images of the pattern input (1)")
    ap.add_argument("--forward-dump", metavar="OUT.npy", help="write this forward pass's heads in that format")
    ap.add_argument("--tolerance", type=float, default=1e-3, help="--forward-check: largest relative norm (1e-3)")
    ap.add_argument("--compile", nargs="?", const="default", metavar="MODE",
                    choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
                    help="torch.compile the forward pass and the loss (MODE: default, reduce-overhead, max-autotune, "
                         "max-autotune-no-cudagraphs; without MODE: default); the first step compiles, timed apart "
                         "as compile_s; the precisions print as PRECISION+compile")
    ap.add_argument("--no-bench", action="store_true", help="skip the timing (with --forward-check etc.)")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="skip the precisions that would end after S seconds from the start (estimated from the "
                         "slowest so far; the first always runs); 0: no limit")
    args = ap.parse_args(argv)

    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print(f"peer: unavailable: torch {torch.__version__} sees no CUDA device (--device {args.device})",
              file=sys.stderr)
        return 3
    if args.threads:
        torch.set_num_threads(args.threads)
    size = args.size or (416 if cuda else 64)
    batch = args.batch or (16 if cuda else 2)
    args.warmup = args.warmup if args.warmup >= 0 else (5 if cuda else 1)
    args.steps = args.steps if args.steps > 0 else (20 if cuda else 3)
    precisions = [p for p in (args.precisions or ("fp32,tf32,bf16,fp16" if cuda else "fp32,bf16")).split(",") if p]
    for p in precisions:
        if p not in PRECISIONS:
            ap.error(f"--precisions: {p!r} is not one of {', '.join(PRECISIONS)}")

    try:
        net, layers = parse_model(args.cfg, args.classes or None, args.size if args.summary else size)
        infer_shapes(net, layers, args.cfg)
    except (CfgError, OSError) as e:
        print(f"peer: error: {e}", file=sys.stderr)
        return 2
    if args.summary:
        print(summary_table(net, layers))
        return 0

    torch.manual_seed(args.seed)
    model = Darknet(net, layers)
    trainable, stats = count_parameters(model)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        label = "cuda"
    else:
        name = f"cpu ({torch.get_num_threads()} threads)"
        label = "cpu"
    heads_text = ", ".join(f"layer {i} {layers[i]['out'][1]}x{layers[i]['out'][2]}x{layers[i]['out'][0]}"
                           for i in model.heads)
    loss_text = ("yolo: darknet's [yolo] formulation (kernels/yolo_loss.h)" if args.loss == "yolo"
                 else "stand-in: 0.5 * sum of squares of the head outputs (NOT the YOLO loss)")
    print(f"peer: torch {torch.__version__} on {name}{'' if cuda else ' (no CUDA: CPU run)'}")
    print(f"peer: {args.cfg}{f' --classes {args.classes}' if args.classes else ''}: {len(layers)} layers, "
          f"{trainable} trainable + {stats} BatchNorm statistics; heads (NHWC, checked on the first forward) {heads_text}")
    print(f"peer: loss {loss_text}; SGD momentum {net['momentum']} decay {net['decay']} (conv weights), "
          f"lr {net['learning_rate']} burn_in {net['burn_in']}")
    sys.stdout.flush()

    result = {"peer": "pytorch", "torch": torch.__version__, "device": label, "device_name": name,
              "cfg": args.cfg, "classes": args.classes or layers[model.heads[0]]["classes"], "size": size,
              "batch": batch, "warmup": args.warmup, "steps": args.steps,
              "loss": "yolo" if args.loss == "yolo" else "stand-in sumsq",
              "params": {"trainable": trainable, "bn_stats": stats},
              "heads": [{"layer": i, "h": layers[i]["out"][1], "w": layers[i]["out"][2], "c": layers[i]["out"][0]}
                        for i in model.heads],
              "results": []}

    if args.weights:
        try:
            header = load_darknet_weights(model, args.weights)
        except (ValueError, OSError) as e:
            print(f"peer: error: {e}", file=sys.stderr)
            return 2
        print(f"peer: loaded {args.weights} (version {header['major']}.{header['minor']}.{header['revision']}, "
              f"seen {header['seen']})")
        result["weights"] = args.weights
    if args.save_weights:
        save_darknet_weights(model, args.save_weights)
        print(f"peer: wrote {args.save_weights}")

    status = 0
    if args.forward_check or args.forward_dump:
        try:
            heads, n_images = forward_heads(copy.deepcopy(model), net, layers, args, device)
        except (ValueError, OSError) as e:
            print(f"peer: error: {e}", file=sys.stderr)
            return 2
        flat = np.concatenate([h.reshape(-1) for h in heads]).astype(np.float32)
        if args.forward_dump:
            np.save(args.forward_dump, flat)
            print(f"peer: wrote {args.forward_dump}: {flat.size} floats ({n_images} images; heads NHWC in layer order)")
        if args.forward_check:
            ref = np.load(args.forward_check).astype(np.float32).reshape(-1)
            if ref.size != flat.size:
                print(f"peer: error: {args.forward_check} has {ref.size} floats, this forward pass {flat.size} "
                      f"({n_images} images: {heads_text})", file=sys.stderr)
                return 2
            checks, pos = [], 0
            for i, h in zip(model.heads, heads):
                r = ref[pos:pos + h.size]
                rel = float(np.linalg.norm(h.reshape(-1) - r) / max(np.linalg.norm(r), 1e-30))
                pos += h.size
                checks.append({"layer": i, "relative_norm": rel})
                print(f"peer: forward check layer {i}: relative norm {rel:.3e}"
                      f"{'' if rel <= args.tolerance else f' > {args.tolerance}: MISMATCH'}")
            worst = max(c["relative_norm"] for c in checks)
            result["forward_check"] = {"reference": args.forward_check, "heads": checks, "worst": worst,
                                       "tolerance": args.tolerance, "ok": worst <= args.tolerance}
            if worst > args.tolerance:
                status = 1

    if not args.no_bench:
        if cuda:
            torch.backends.cudnn.benchmark = True
        g = torch.Generator().manual_seed(args.seed)
        images = torch.rand(batch, net["channels"], size, size, generator=g).to(device) \
            .contiguous(memory_format=torch.channels_last)
        truths, valid = random_truths(batch, args.max_boxes, layers[model.heads[0]]["classes"], g, device)
        slowest = 0.0
        for p in precisions:
            elapsed = time.monotonic() - T0
            if args.budget_s and slowest and elapsed + slowest > args.budget_s:
                print(f"peer: {p} skipped: over the time budget ({elapsed:.0f} s gone, the slowest precision took "
                      f"{slowest:.0f} s, --budget-s {args.budget_s:g})")
                result["results"].append({"precision": p, "skipped": "time budget"})
                continue
            if not cuda and p in ("tf32", "fp16"):
                print(f"peer: {p} skipped: not on the CPU (fp32 and bf16 only)")
                result["results"].append({"precision": p, "skipped": "not on the CPU"})
                continue
            t_start = time.monotonic()
            try:
                r = benchmark(p, model, net, layers, images, truths, valid, args, device)
                r["wall_s"] = time.monotonic() - t_start
                slowest = max(slowest, r["wall_s"])
            except RuntimeError as e:  # e.g. out of memory: report, go on with the next
                msg = str(e).splitlines()[0]
                print(f"peer: {p} failed: {msg}")
                result["results"].append({"precision": p, "failed": msg})
                status = status or 1
                if cuda:
                    torch.cuda.empty_cache()
                continue
            result["results"].append(r)
            extra = f", loss scale {r['loss_scale']:g}" if "loss_scale" in r else ""
            if "compile_s" in r:
                extra += f", compiled ({args.compile}) in {r['compile_s']:.1f} s"
            print(f"peer: {r['precision']} {r['img_s']:.1f} img/s ({r['ms_step']:.2f} ms/step) [{label}] median "
                  f"{r['ms_median']:.2f} ms, loss {r['loss_last']:.3f} per image{extra}; {r['wall_s']:.1f} s "
                  f"with warm-up")
            sys.stdout.flush()
    print(json.dumps(result))
    return status


if __name__ == "__main__":
    sys.exit(main())
