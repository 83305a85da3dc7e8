"""Seconds per REALM pre-training step (MiniLM, both towers training), with the FLOP floor and the op breakdown.

Issue #20. Real batches of REALM pre-training (``data.batch_size`` masked queries × ``model.num_candidates``
candidates from the MIPS index, the null document first, trivial retrievals excluded) are drawn once from a
workspace that ``make demo`` leaves (``runs/demo``: blocks, salient-span examples, index) and saved; each
setting then runs in its own process (the allocator is chosen when TensorFlow starts), builds the model from
the config, traces the task's own ``train_step`` once and times ``--steps`` updates over the same batches:

    before    every batch padded to its longest row, TensorFlow's default CPU allocator
    buckets   model.reader_length_buckets=4, model.candidate_length_buckets=4 (length groups), default allocator
    after     the same with realm-tf's process settings (realm_tf/process_settings.py: the BFC allocator)

Printed per setting: seconds per step, CPU user/system seconds and minor page faults over the timed steps,
the FLOPs of the step as padded and as useful (real wordpieces only; forward + backward = 3 × forward), and
numpy's sgemm rate (``machine_reference``: the cores' own kernel) measured in the same run, before and after, as
the floor's reference. With
``--profile`` the TensorFlow profiler traces two more steps and the op types with the largest share of op time
are printed (from the trace's executor events).

    .venv/bin/python benchmarks/realm_step_benchmark.py --workdir runs/demo --steps 6 --profile
"""
from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import machine_reference  # noqa: E402  (benchmarks/machine_reference.py)
import op_profile  # noqa: E402  (benchmarks/op_profile.py)
import result_records  # noqa: E402  (benchmarks/)
import setting_runs  # noqa: E402  (benchmarks/setting_runs.py)

SETTINGS = {
    "before": (["model.reader_length_buckets=1", "model.candidate_length_buckets=1"],
               {"TF_CPU_ALLOCATOR_USE_BFC": "false"}),
    "buckets": (["model.reader_length_buckets=4", "model.candidate_length_buckets=4"],
                {"TF_CPU_ALLOCATOR_USE_BFC": "false"}),
    "after": (["model.reader_length_buckets=4", "model.candidate_length_buckets=4"], {}),
}


def _workspace_overrides(workdir: str) -> list[str]:
    return [f"data.blocks_dir={workdir}/blocks", f"data.pretraining_dir={workdir}/pretraining",
            f"index.index_dir={workdir}/index", f"refresh.export_dir={workdir}/export", "data.batch_size=4",
            "model.num_candidates=8"]


def step_flops(batch: dict, cfg, mode: str) -> float:
    """Forward + backward (3 × forward) FLOPs of one step's three BERTs: ``padded`` to each tensor's width,
    ``executed`` as the model reads them (length groups of ``model.reader_length_buckets`` /
    ``model.candidate_length_buckets`` rows, each padded to its longest) or ``useful`` (real wordpieces only).
    The MLM head and the projections are left out (under 1%)."""
    import numpy as np

    e = cfg.model.encoder
    buckets = {"query_": 1, "candidates_": cfg.model.candidate_length_buckets,
               "reader_": cfg.model.reader_length_buckets}
    total = 0.0
    for prefix, groups in buckets.items():
        mask = np.asarray(batch[prefix + "input_mask"])
        mask = mask.reshape(-1, mask.shape[-1])  # [rows, width]
        real = np.sort(mask.sum(-1))  # [rows]
        if mode == "padded":
            lengths = [mask.shape[1]] * len(real)
        elif mode == "executed":
            size = -(-len(real) // groups)
            lengths = [int(real[i:i + size].max()) for i in range(0, len(real), size) for _ in real[i:i + size]]
        else:
            lengths = real.tolist()
        total += machine_reference.bert_forward_flops(lengths, e.num_layers, e.hidden_size, e.intermediate_size)
    return 3 * total


def collect(args: argparse.Namespace, path: str) -> None:
    """Draws ``--steps + 1`` training batches from the workspace's pipeline into ``path`` (npz)."""
    import numpy as np

    import realm_tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
    from realm_tf import config as config_lib
    from realm_tf.index import refresh_supervisor
    from realm_tf.tasks import realm_pretraining
    from realm_tf.tasks import retrieval_augmented_input

    cfg = config_lib.load_config(args.config, _workspace_overrides(args.workdir) + args.overrides)
    task = realm_pretraining.RealmPretrainingTask(cfg, evaluate=False)
    loader = refresh_supervisor.wait_for_index(
        dict(index_dir=cfg.index.index_dir, expected_dim=cfg.model.projection_size,
             expected_vocab_hash=task.tokenizer.vocab_hash, kind=cfg.index.kind, blocks_dir=cfg.data.blocks_dir),
        timeout=10.0)
    task.inputs = retrieval_augmented_input.RetrievalAugmentedInput(cfg, loader, None, task.tokenizer)
    arrays = collections.defaultdict(list)
    for features, labels in task.build_inputs(seed=args.seed).take(args.steps + 1):
        for key, value in {**{"f/" + k: v for k, v in features.items()},
                           **{"l/" + k: v for k, v in labels.items()}}.items():
            arrays[key].append(value.numpy())
    # Batches differ in width: store each batch separately.
    np.savez(path, **{f"{i}|{key}": value for key, values in arrays.items() for i, value in enumerate(values)})


def load_batches(path: str) -> list[tuple[dict, dict]]:
    import numpy as np

    data = np.load(path)
    batches: dict[int, tuple[dict, dict]] = collections.defaultdict(lambda: ({}, {}))
    for name in data.files:
        index, key = name.split("|", 1)
        kind, key = key.split("/", 1)
        batches[int(index)][0 if kind == "f" else 1][key] = data[name]
    return [batches[i] for i in sorted(batches)]


def run_setting(args: argparse.Namespace, name: str, path: str) -> dict:
    """Times one setting in this process (the parent started it with the setting's environment)."""
    import realm_tf  # noqa: F401
    from realm_tf import process_settings

    process_settings.apply()
    import tensorflow as tf

    from realm_tf import config as config_lib
    from realm_tf.core import optimizer as optimizer_lib
    from realm_tf.tasks import realm_pretraining

    overrides, _ = SETTINGS[name]
    cfg = config_lib.load_config(args.config, _workspace_overrides(args.workdir) + args.overrides + overrides)
    batches = load_batches(path)
    task = realm_pretraining.RealmPretrainingTask(cfg, evaluate=False)
    model = task.build_model()
    optimizer = optimizer_lib.build_optimizer(cfg.pretrain, model)
    optimizer_lib.create_slots(optimizer, task.trainable_variables(model))
    signature = [({k: tf.TensorSpec([None] * v.ndim, tf.as_dtype(v.dtype)) for k, v in batches[0][0].items()},
                  {k: tf.TensorSpec([None] * v.ndim, tf.as_dtype(v.dtype)) for k, v in batches[0][1].items()})]
    step = tf.function(lambda inputs: task.train_step(inputs, model, optimizer), input_signature=signature,
                       autograph=False)
    sgemm_before = machine_reference.sgemm_gflops()
    start = time.perf_counter()
    step(batches[0])  # the trace and the first step
    first = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    for batch in batches[1:]:
        float(step(batch)["loss"])
    seconds = (time.perf_counter() - start) / (len(batches) - 1)
    after = resource.getrusage(resource.RUSAGE_SELF)
    sgemm_after = machine_reference.sgemm_gflops()
    result = {
        "setting": name, "seconds_per_step": seconds, "first_step_seconds": first,
        "user_seconds_per_step": (after.ru_utime - usage.ru_utime) / (len(batches) - 1),
        "system_seconds_per_step": (after.ru_stime - usage.ru_stime) / (len(batches) - 1),
        "minor_faults_per_step": (after.ru_minflt - usage.ru_minflt) / (len(batches) - 1),
        "max_rss_gb": after.ru_maxrss / 1e6, "sgemm_gflops": [sgemm_before, sgemm_after],
        "sgemm_kernel": machine_reference.sgemm_kernel(),
        **{f"{mode}_tflop": sum(step_flops(b[0], cfg, mode) for b in batches[1:]) / (len(batches) - 1) / 1e12
           for mode in ("padded", "executed", "useful")},
        "env": {k: os.environ.get(k, "") for k in ("TF_CPU_ALLOCATOR_USE_BFC",)},
    }
    if args.profile:
        result["ops"] = op_profile.profile(lambda: [float(step(batch)["loss"]) for batch in batches[1:3]],
                                           args.top_ops)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--workdir", default="runs/demo", help="a `make demo` workspace (blocks, pretraining, index)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per setting (after the traced one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--profile", action="store_true", help="print the op breakdown of each setting")
    parser.add_argument("--top-ops", type=int, default=12)
    parser.add_argument("--batches", default="", help="(internal) the saved batches")
    parser.add_argument("--child", default="", help="(internal) run this one setting and print its JSON")
    args = parser.parse_args()
    if args.child:
        setting_runs.emit(run_setting(args, args.child, args.batches))
        return 0
    path = args.batches or os.path.join(tempfile.mkdtemp(prefix="realm_step_"), "batches.npz")
    if not args.batches:
        collect(args, path)
    print(f"config {args.config} + {args.overrides}; workspace {args.workdir}; {args.steps} timed steps per "
          f"setting; os.cpu_count {os.cpu_count()}", flush=True)
    for name in args.settings:
        overrides, env = SETTINGS[name]
        command = [sys.executable, os.path.abspath(__file__), "--child", name, "--batches", path,
                   "--config", args.config, "--workdir", args.workdir, "--steps", str(args.steps),
                   "--top-ops", str(args.top_ops)] + sum((["--set", o] for o in args.overrides), [])
        if args.profile:
            command.append("--profile")
        r = setting_runs.run(command, env, f"setting {name}")
        sgemm = sum(r["sgemm_gflops"]) / 2
        cpu_seconds = r["user_seconds_per_step"] + r["system_seconds_per_step"]
        print(f"{name:8s} {' '.join(overrides)} {r['env']}\n"
              f"  {r['seconds_per_step']:.2f} s/step (first step with its trace {r['first_step_seconds']:.1f} s); "
              f"CPU per step: user {r['user_seconds_per_step']:.2f} s, system {r['system_seconds_per_step']:.2f} s "
              f"({100 * r['system_seconds_per_step'] / max(cpu_seconds, 1e-9):.1f}%); "
              f"minor faults/step {r['minor_faults_per_step']:,.0f}; max RSS {r['max_rss_gb']:.2f} GB\n"
              f"  FLOPs/step: padded {r['padded_tflop']:.3f} T, executed {r['executed_tflop']:.3f} T, "
              f"useful {r['useful_tflop']:.3f} T; "
              f"sgemm {r['sgemm_gflops'][0]:.0f}/{r['sgemm_gflops'][1]:.0f} GFLOP/s ({r['sgemm_kernel']}) "
              f"-> floor {r['useful_tflop'] * 1e3 / sgemm:.2f} s "
              f"(useful FLOPs at the sgemm rate; executed: {r['executed_tflop'] * 1e3 / sgemm:.2f} s); "
              f"achieved {r['useful_tflop'] * 1e3 / r['seconds_per_step']:.0f} useful GFLOP/s "
              f"= {100 * r['useful_tflop'] * 1e3 / r['seconds_per_step'] / sgemm:.0f}% of sgemm", flush=True)
        if r.get("ops"):
            print("  op time over 2 profiled steps, by op type:\n" + op_profile.format_breakdown(r["ops"]), flush=True)
        if name == "after":  # realm-tf's own settings: the record
            useful = r["useful_tflop"] * 1e3 / r["seconds_per_step"]  # GFLOP/s
            result_records.write(
                "speed-realm-step", area="Speed and memory", order=40,
                verdict="holds" if r["seconds_per_step"] < 11 else "negative",
                claim="A REALM pre-training step with MiniLM (4 queries × 8 candidates, both towers and the reader "
                      f"training) takes {'under' if r['seconds_per_step'] < 11 else 'over'} the 11 s goal.",
                figure=f"{r['seconds_per_step']:.2f} s/step, {useful:.0f} useful GFLOP/s = {100 * useful / sgemm:.0f}% "
                       f"of sgemm ({r['sgemm_gflops'][0]:.0f}/{r['sgemm_gflops'][1]:.0f} GFLOP/s); max RSS "
                       f"{r['max_rss_gb']:.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
