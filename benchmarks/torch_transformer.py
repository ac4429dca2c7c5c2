"""Training throughput of torch.nn.Transformer at our model's shape, printed as JSON:
the comparator of `train_throughput.py --compare-torch`, which runs it in its own
process (TensorFlow and PyTorch never share one).

    python benchmarks/torch_transformer.py --model base --batch-size 64 --length 64
    python benchmarks/torch_transformer.py --model tiny --vocab-size 300 --batch-size 8 \\
        --length 16 --precisions float32 --compile off        # a quick smoke run

The model is `torch.nn.Transformer` with our `TransformerConfig` preset's shape
(layers, d_model, heads, d_ff, dropout, layer-norm epsilon, post-norm or pre-norm
with a final norm after each stack, as ours: the encoder and decoder are passed in so
that a post-norm stack gets no extra final norm), a shared embedding scaled by
sqrt(d_model) and tied to the output projection (no bias), sinusoidal positions, the
label-smoothed cross entropy ignoring padding (id 0) and Adam (0.9, 0.98, 1e-9; fused
on a GPU) on the paper's schedule. Its parameters are then exactly ours. It trains on
the random batch train_throughput.py uses (same batch size, length, vocabulary;
padding masks passed as ours derives them).

Modes: `--precisions` float32 (TF32 matmuls allowed on a GPU, as TensorFlow does by
default; the JSON says so in `tf32`) and bf16 (autocast to bfloat16, the loss in
float32), each `--compile` off (eager) and/or on (`torch.compile` of the forward pass
and loss). A mode that fails (torch.compile without a working compiler, say) is
reported with `status: "failed"` and its error instead of stopping the run.

Timing and MFU as train_throughput.py's: `--warmup-steps` steps apart
(`first_steps_seconds`, compilation included), then the median of `--steps`, each
synchronized by reading the loss; FLOPs from its `forward_flops`; the peak from the
same table and logic (benchmarks/machine.py), measured here with PyTorch's kernels.
`--profile-steps N` profiles N more steps and sums their kernels by kind (`profile`, in
the shape of `train_throughput.py --profile-steps`'s: benchmarks/kernel_profile.py).
"""

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # keras_transformer.config (imports no TensorFlow)
    sys.path.append(ROOT)

from machine import best_seconds  # noqa: E402
from machine import cpu_flags  # noqa: E402
from machine import datasheet_peak  # noqa: E402
from machine import gpu_matmul_dtype  # noqa: E402
from machine import mfu_fields  # noqa: E402
from machine import nvidia_smi  # noqa: E402
from train_throughput import forward_flops  # noqa: E402

PRECISIONS = {"float32": "float32", "bf16": "bf16", "mixed_bfloat16": "bf16", "bfloat16": "bf16"}


def build_model(config, max_length):
    """torch.nn.Transformer with a tied shared embedding and sinusoidal positions."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    if config.d_k * config.num_heads != config.d_model or config.d_v != config.d_k:
        raise ValueError("torch.nn.Transformer needs d_k = d_v = d_model / num_heads. "
                         f"Received: d_k={config.d_k}, d_v={config.d_v}")

    class TiedTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            d = config.d_model
            self.scale = math.sqrt(d)
            self.embedding = nn.Embedding(config.vocab_size, d)
            layer_args = dict(d_model=d, nhead=config.num_heads, dim_feedforward=config.d_ff,
                              dropout=config.dropout_rate, activation="relu",
                              layer_norm_eps=config.layer_norm_epsilon, batch_first=True,
                              norm_first=config.norm_first)

            def final_norm():  # pre-norm stacks end with a layer norm, as ours
                return nn.LayerNorm(d, config.layer_norm_epsilon) if config.norm_first else None

            encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(**layer_args),
                                            config.num_layers, norm=final_norm(),
                                            enable_nested_tensor=False)
            decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**layer_args),
                                            config.num_layers, norm=final_norm())
            # (its constructor re-initializes the stacks' matrices: Xavier uniform)
            self.transformer = nn.Transformer(custom_encoder=encoder, custom_decoder=decoder,
                                              batch_first=True, **{
                                                  k: v for k, v in layer_args.items()
                                                  if k != "batch_first"})
            nn.init.normal_(self.embedding.weight, std=d**-0.5)
            self.dropout = nn.Dropout(config.dropout_rate)
            position = torch.arange(max_length, dtype=torch.float32)[:, None]
            rate = torch.pow(10000.0, -torch.arange(0, d, 2, dtype=torch.float32) / d)
            table = torch.zeros(max_length, d)
            table[:, 0::2] = torch.sin(position * rate)  # sines on even channels
            table[:, 1::2] = torch.cos(position * rate)[:, : d // 2]
            self.register_buffer("positions", table, persistent=False)

        def embed(self, ids):
            x = self.embedding(ids) * self.scale + self.positions[: ids.shape[1]]
            return self.dropout(x)

        def forward(self, source, target):
            length = target.shape[1]
            causal = torch.triu(torch.ones(length, length, dtype=torch.bool,
                                           device=target.device), diagonal=1)
            source_padding, target_padding = source == 0, target == 0
            y = self.transformer(self.embed(source), self.embed(target), tgt_mask=causal,
                                 src_key_padding_mask=source_padding,
                                 tgt_key_padding_mask=target_padding,
                                 memory_key_padding_mask=source_padding, tgt_is_causal=True)
            return F.linear(y, self.embedding.weight)  # tied, no bias

    return TiedTransformer()


def count_parameters(model):
    """Parameters, each shared tensor once (`parameters()` yields the tied one once)."""
    return sum(p.numel() for p in model.parameters())


def torch_device(torch, name):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type != "cuda":
        return device, {"type": "CPU", "name": cpu_flags()["model_name"],
                        "torch_threads": torch.get_num_threads()}
    properties = torch.cuda.get_device_properties(device)
    info = {"type": "GPU", "name": torch.cuda.get_device_name(device),
            "count": torch.cuda.device_count(),
            "compute_capability": f"{properties.major}.{properties.minor}",
            "memory_total_mib": properties.total_memory // 2**20,
            "torch_cuda_version": torch.version.cuda}
    info.update({k: v for k, v in nvidia_smi(device.index or 0).items()
                 if k not in info})
    return device, info


def measured_peak(torch, device, dtype, chain=16, repeats=5):
    """`(FLOP/s, size)` of PyTorch's matmul: on a GPU `chain` chained 8192-size
    products kept on the device, synchronized by reading one scalar; on the CPU one
    product of size up to 2048 (train_throughput's TensorFlow measurement), the best
    of 10: smaller where one takes over 50 ms (bfloat16 on a CPU without bfloat16
    instructions runs at well under 1 GFLOP/s)."""
    gpu = device.type == "cuda"
    if gpu:
        size = 8192
    else:
        chain, repeats, size = 1, 10, 256
        while size < 2048:
            x = torch.randn(size, size).to(dtype)
            start = time.perf_counter()
            x @ x
            if time.perf_counter() - start > 0.05:
                break
            size *= 2
    a = torch.randn(size, size, device=device).to(dtype)
    w = (torch.randn(size, size, device=device) * size**-0.5).to(dtype)

    def run():
        x = a
        for _ in range(chain):
            x = x @ w
        return x[0, 0].item()

    return 2 * size**3 * chain / best_seconds(run, repeats), size


def peaks_for(torch, device, info, precision, tf32, cache):
    """`{"measured", "datasheet"}` peaks for a mode, as train_throughput's."""
    compute = "bfloat16" if precision == "bf16" else "float32"
    if compute not in cache:
        dtype = torch.bfloat16 if compute == "bfloat16" else torch.float32
        flops, size = measured_peak(torch, device, dtype)
        if device.type == "cuda":
            capability = tuple(int(p) for p in info["compute_capability"].split("."))
            matmul_dtype = gpu_matmul_dtype(compute, tf32, capability)
            source = f"measured: {size}^3 {matmul_dtype} matmul (x16 chained), PyTorch"
            sheet = datasheet_peak(info["name"], matmul_dtype)
        else:
            source, sheet = f"measured: {size}^3 {compute} matmul, PyTorch", None
        cache[compute] = {"measured": {"flops": flops, "source": source}, "datasheet": sheet}
    return cache[compute]


def run_mode(torch, config, device, precision, compile_model, args):
    """One mode's result: warm-up and measured steps on the fixed random batch."""
    import numpy as np
    from torch.nn import functional as F

    torch.manual_seed(0)
    max_length = max(config.max_positions, args.length)
    model = build_model(config, max_length).to(device).train()
    fused = device.type == "cuda"
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9,
                                 fused=fused)
    warmup = 4000
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: config.d_model**-0.5 * min(
        (step + 1) ** -0.5, (step + 1) * warmup**-1.5))
    rng = np.random.RandomState(0)  # the batch train_throughput.py draws
    shape = (args.batch_size, args.length)
    source, target_inputs, targets = (
        torch.from_numpy(rng.randint(4, config.vocab_size, shape).astype("int64")).to(device)
        for _ in range(3))
    bf16 = precision == "bf16"

    def loss_of(source, target_inputs, targets):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(source, target_inputs)
        return F.cross_entropy(logits.float().reshape(-1, config.vocab_size),
                               targets.reshape(-1), ignore_index=0,
                               label_smoothing=config.label_smoothing)

    compute_loss = torch.compile(loss_of) if compile_model else loss_of

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = compute_loss(source, target_inputs, targets)
        loss.backward()
        optimizer.step()
        schedule.step()
        return loss.item()  # synchronizes, as Keras's train_on_batch

    start = time.perf_counter()
    for _ in range(args.warmup_steps):
        step()
    warmup_seconds = time.perf_counter() - start
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    seconds = float(np.median(times))
    profile = {}
    if args.profile_steps:  # after the timed steps: the profiler's cost stays out of them
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        from kernel_profile import summarize
        from kernel_profile import torch_kernels

        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            start = time.perf_counter()
            for _ in range(args.profile_steps):
                step()
            wall = time.perf_counter() - start
        profile = {"profile": summarize(torch_kernels(profiler), args.profile_steps, wall)}
    return {
        **profile,
        "parameters": count_parameters(model),
        "optimizer": "Adam (fused)" if fused else "Adam",
        "first_steps_seconds": round(warmup_seconds, 2),
        "seconds_per_step": round(seconds, 4),
        "step_seconds": [round(t, 3) for t in times],
        "target_tokens_per_second": round(args.batch_size * args.length / seconds, 1),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="base", help="TransformerConfig preset")
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--batch-size", type=int, default=None, help="rows (default 64)")
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--tokens-per-batch", type=int, default=None,
                        help="instead of --batch-size: tokens // length rows")
    parser.add_argument("--precisions", default="float32,bf16", help="float32, bf16 or both")
    parser.add_argument("--compile", default="off,on", help="torch.compile: off, on or off,on")
    parser.add_argument("--device", default="auto", help="auto (cuda if there is one), cuda, cpu")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (default PyTorch's: the cores; on a CPU "
                             "that another process also loads, OpenMP's spinning threads can "
                             "make steps many times slower)")
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5,
                        help="measured steps per mode (the median is reported)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="then this many steps under torch.profiler: where the GPU's "
                             "time goes, as benchmarks/kernel_profile.py sums it (`profile`)")
    args = parser.parse_args()
    if args.tokens_per_batch is not None:
        if args.batch_size is not None:
            parser.error("give --batch-size or --tokens-per-batch, not both")
        args.batch_size = max(1, args.tokens_per_batch // args.length)
    elif args.batch_size is None:
        args.batch_size = 64
    precisions = [PRECISIONS[p] for p in args.precisions.split(",")]

    import torch

    from keras_transformer.config import TransformerConfig

    if args.threads:
        torch.set_num_threads(args.threads)

    config = TransformerConfig.preset(args.model, vocab_size=args.vocab_size)
    device, info = torch_device(torch, args.device)
    tf32 = device.type == "cuda"
    if tf32:  # as TensorFlow by default: float32 matmuls and convolutions on TF32
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    flops = 3 * forward_flops(config, args.batch_size, args.length, args.length)
    peak_cache, results = {}, []
    for precision in precisions:
        for compile_flag in args.compile.split(","):
            compile_model = compile_flag == "on"
            mode = precision + ("+compile" if compile_model else "")
            result = {"framework": "torch", "mode": mode, "precision": precision,
                      "autocast": "bfloat16" if precision == "bf16" else None,
                      "tf32": tf32 and precision == "float32", "compile": compile_model}
            try:
                result.update(run_mode(torch, config, device, precision, compile_model, args))
            except Exception as error:  # noqa: BLE001 - reported, the other modes go on
                result.update({"status": "failed",
                               "error": f"{type(error).__name__}: {error}"[-4000:]})
                print(f"torch_transformer.py: {mode} failed: {result['error'][:500]}",
                      file=sys.stderr, flush=True)
            else:
                peaks = peaks_for(torch, device, info, precision, tf32, peak_cache)
                result["status"] = "ok"
                result["train_flops_per_step"] = flops
                result.update(mfu_fields(flops, result["seconds_per_step"], peaks))
            results.append(result)
            print(json.dumps(result), file=sys.stderr, flush=True)  # progress
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(json.dumps({
        "benchmark": "torch_transformer",
        "torch_version": torch.__version__,
        "model": args.model,
        "vocab_size": args.vocab_size,
        "batch_size": args.batch_size,
        "length": args.length,
        "tokens_per_batch": args.batch_size * args.length,
        "device": info,
        "machine": cpu_flags(),
        "peaks": {compute: {kind: peak and {"flops": round(peak["flops"]),
                                            "source": peak["source"]}
                            for kind, peak in sources.items()}
                  for compute, sources in peak_cache.items()},
        "results": results,
    }, indent=2))


if __name__ == "__main__":
    main()
