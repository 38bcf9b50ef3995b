"""LLM inference with Beam RunInference: Pub/Sub in, Pub/Sub out (streaming), or JSONL (batch).

It needs no gpuflow package: Dataflow workers run it with its modules beside it, on the images' PYTHONPATH:
prompt_io.py (parsing, validation, routing), llm_handlers.py (the model handlers) and llm_models.py (model loading
and batched generation, without Beam).

Streaming::

    python beam_jobs/llm_inference.py --model-name DIR_OR_HUB_NAME --state-dict-path gs://.../state_dict.pth \
        --messages-subscription projects/P/subscriptions/S --responses-topic projects/P/topics/T \
        --dead-letter-topic projects/P/topics/D [Beam pipeline options]

Batch (a line in is {"id": ..., "prompt": ...}; an answer line adds "response" and "model")::

    python beam_jobs/llm_inference.py --model-name ... --state-dict-path ... --input "prompts/*.jsonl" --output out/ \
        [--dead-letter-output dead/]

A batch job also writes summary.json beside its answers: lines in, answered, dead-lettered (by reason), tokens
generated.

Every prompt ends in exactly one place: answered, or in the dead-letter output with its reason. Batch input is
read as bytes, so a line that is no UTF-8 (or no JSON object with an id and a string prompt, or a repeated id)
becomes a dead letter instead of failing the job.
"""

import argparse
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
from apache_beam.ml.inference.base import ModelHandler, RunInference
from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, StandardOptions

from llm_handlers import GenerateHandler, make_vllm_handler, vllm_inference_args
from llm_models import ARCHITECTURES
from prompt_io import (
    ValidatePrompt,
    answer_to_pubsub,
    dead_letter_to_pubsub,
    failed_batch_to_dead_letters,
    first_of_each_id,
    parse_jsonl_line,
    pubsub_to_record,
    route_completion,
    route_prediction,
)

log = logging.getLogger("gpuflow.llm_inference")


# ------------------------------------------------------------------------------------------
# Pipeline


def flag(value: str | bool = True) -> bool:
    """A boolean flag given bare (``--require-gpu``) or with a value, as a Flex Template launcher passes it."""
    if isinstance(value, bool):
        return value
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {value!r}")


def build_arg_parser() -> argparse.ArgumentParser:
    """Every option also has its underscore spelling, the one a Flex Template launcher passes."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)

    def option(name: str, **kwargs) -> None:
        parser.add_argument(f"--{name}", f"--{name.replace('-', '_')}", dest=name.replace("-", "_"), **kwargs)

    option("model-name", required=True)
    option("state-dict-path", required=True)
    option("max-new-tokens", type=int, default=16)
    option("max-input-tokens", type=int, default=512)
    option("dtype", choices=("auto", "bfloat16", "float32"), default="auto")
    option("require-gpu", type=flag, nargs="?", const=True, default=False, help="fail when no GPU is visible")
    option("min-batch-size", type=int, default=1)
    option("max-batch-size", type=int, default=16)
    option("max-batch-duration-secs", type=float, default=0)
    option("model-copies", type=int, default=None,
           help="model copies per worker, shared across the SDK processes (gpu.sharing: model_copies)")
    option("accelerator-hint", default=None,
           help="Beam's accelerator resource hint for the RunInference step alone (right fitting)")
    option("group-by-length", type=flag, nargs="?", const=True, default=False,
           help="batch prompts of similar token length together (less padding)")
    option("model-label", default=None, help="the model's name (default: --model-name)")
    option("model-version", default=None,
           help="the version id each answer carries (default: the label); a deployment's versions are its own")
    option("model-refresh-folder", default=None,
           help="streaming: the folder of version pointers to watch; a new one switches the model without a restart")
    option("model-refresh", choices=("side_input", "poll"), default="side_input",
           help="side_input: RunInference's model_metadata_pcoll from WatchFilePattern (Dataflow); poll: the handler "
                "reads the folder itself (the local DirectRunner, which cannot run that side input)")
    option("model-refresh-interval-s", type=float, default=60, help="how often the pointer folder is read")
    option("architecture", choices=ARCHITECTURES, default="auto",
           help="seq2seq or causal (decoder-only); auto reads the model's config")
    option("engine", choices=("transformers", "vllm"), default="transformers",
           help="transformers: batched generate in this process; vllm: Beam's vLLM handler (a GPU, the vllm image)")
    option("vllm-gpu-memory-utilization", type=float, default=0.9,
           help="vllm: the share of the GPU's memory vLLM takes (weights and KV cache)")
    option("chat-template", type=flag, nargs="?", const=True, default=False,
           help="format each prompt with the tokenizer's chat template (instruction-tuned causal models)")
    batch = parser.add_argument_group("batch mode")
    batch.add_argument("--input", help="JSONL prompts file or glob")
    batch.add_argument("--output", help="directory (ending in /) or prefix for the JSONL outputs")
    batch.add_argument("--dead-letter-output", "--dead_letter_output", dest="dead_letter_output",
                       help="directory (ending in /) for dead_letters.jsonl (default: beside the answers)")
    batch.add_argument("--eval-rounds", "--eval_rounds", dest="eval_rounds", type=int, default=0,
                       help="a rollout's evaluation: the set sorted by id, cut into batches of --max-batch-size, run "
                            "this many times; each answer carries its batch's key, round and index")
    streaming = parser.add_argument_group("streaming mode")
    for name in ("messages-subscription", "responses-topic", "dead-letter-topic"):
        streaming.add_argument(f"--{name}", f"--{name.replace('-', '_')}", dest=name.replace("-", "_"))
    return parser


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = build_arg_parser()
    known, pipeline_args = parser.parse_known_args(argv)
    streaming_args = [known.messages_subscription, known.responses_topic, known.dead_letter_topic]
    if known.input or known.output or known.dead_letter_output:
        if not (known.input and known.output) or any(streaming_args):
            parser.error("batch mode takes --input and --output, and no streaming arguments")
    elif not all(streaming_args):
        parser.error(
            "give --input and --output (batch), or --messages-subscription, --responses-topic and "
            "--dead-letter-topic (streaming)"
        )
    return known, pipeline_args


#: The files of a batch job in an --output directory (the dead letters also in --dead-letter-output's).
ANSWERS_FILE, DEAD_LETTERS_FILE, SUMMARY_FILE = "responses.jsonl", "dead_letters.jsonl", "summary.json"


def output_paths(output: str, dead_letter_output: str | None = None) -> tuple[str, str, str]:
    """The answers file, the dead-letter file and the summary file for ``--output`` (and ``--dead-letter-output``)."""
    if output.endswith("/") or os.path.isdir(output):
        base = output.rstrip("/") + "/"
        paths = [base + ANSWERS_FILE, base + DEAD_LETTERS_FILE, base + SUMMARY_FILE]
    else:
        paths = [f"{output}-{ANSWERS_FILE}", f"{output}-{DEAD_LETTERS_FILE}", f"{output}-{SUMMARY_FILE}"]
    if dead_letter_output:
        paths[1] = dead_letter_output.rstrip("/") + "/" + DEAD_LETTERS_FILE
    return paths[0], paths[1], paths[2]


def make_summary(_, lines_in: int, answered: int, dead_lettered: int, response_tokens: int,
                 reasons: dict[str, int]) -> dict[str, Any]:
    """The batch job's own counts: every line read ends answered or dead-lettered, so they add up."""
    return {"lines_in": lines_in, "answered": answered, "dead_lettered": dead_lettered,
            "response_tokens": response_tokens, "dead_letter_reasons": dict(sorted(reasons.items()))}


def write_summary(pipeline: beam.Pipeline, lines, answers, dead_letters, path: str) -> None:
    """One JSON file of counts, computed in the job from the very collections it reads and writes."""
    from apache_beam.pvalue import AsDict, AsSingleton

    def count(label: str, collection):
        return collection | f"Count{label}" >> beam.combiners.Count.Globally()

    tokens = (answers | "ResponseTokens" >> beam.Map(lambda answer: answer.get("response_tokens") or 0)
              | "SumTokens" >> beam.CombineGlobally(sum))
    reasons = (dead_letters | "Reasons" >> beam.Map(lambda letter: letter["reason"])
               | "CountReasons" >> beam.combiners.Count.PerElement())
    _ = (
        pipeline
        | "SummaryStart" >> beam.Create([None])
        | "Summary" >> beam.Map(make_summary, lines_in=AsSingleton(count("Lines", lines)),
                                answered=AsSingleton(count("Answered", answers)),
                                dead_lettered=AsSingleton(count("DeadLettered", dead_letters)),
                                response_tokens=AsSingleton(tokens), reasons=AsDict(reasons))
        | "FormatSummary" >> beam.Map(json.dumps)
        | "WriteSummary" >> beam.io.WriteToText(path, shard_name_template="", num_shards=1)
    )


def make_model_handler(args: argparse.Namespace, streaming: bool) -> GenerateHandler:
    return GenerateHandler(
        model_name=args.model_name,
        state_dict_path=args.state_dict_path,
        max_new_tokens=args.max_new_tokens,
        dtype=args.dtype,
        require_gpu=args.require_gpu,
        min_batch_size=args.min_batch_size,
        max_batch_size=args.max_batch_size,
        # Cross-bundle batching needs a stateful DoFn; it only makes sense in streaming.
        max_batch_duration_secs=args.max_batch_duration_secs if streaming else None,
        group_by_length=args.group_by_length,
        model_copies=args.model_copies,
        architecture=args.architecture,
        model_version=args.model_version or args.model_label or args.model_name,
        refresh_folder=args.model_refresh_folder if streaming else None,
        refresh_poll_s=args.model_refresh_interval_s if streaming and args.model_refresh_folder
        and args.model_refresh == "poll" else 0,
    )


def model_versions(pipeline: beam.Pipeline, args: argparse.Namespace, streaming: bool):
    """Beam's automatic model refresh: WatchFilePattern on the deployment's pointer folder, as RunInference's
    model metadata side input (each new pointer goes to the handler's ``update_model_path``). None without a
    folder, or where the handler polls it instead (``--model-refresh poll``)."""
    if not (streaming and args.model_refresh_folder and args.model_refresh == "side_input"):
        return None
    from apache_beam.ml.inference.utils import WatchFilePattern

    pattern = args.model_refresh_folder.rstrip("/") + "/*.json"
    require_a_pointer(pattern)
    return pipeline | "WatchModelVersions" >> WatchFilePattern(pattern, interval=args.model_refresh_interval_s)


class NoVersionPointer(SystemExit):
    """The model refresh folder holds no pointer, so Beam's WatchFilePattern could never fire."""


def require_a_pointer(pattern: str) -> None:
    """Refuse to start a job whose model refresh would stall. Beam 2.77's WatchFilePattern "expects at least one
    file present that matches the file_pattern" before the pipeline starts (apache_beam/ml/inference/utils.py): it
    matches with EmptyMatchTreatment.DISALLOW, every poll of an empty folder fails, the side input never fires, and
    RunInference holds every prompt. gpuflow writes a pointer before it starts a deployment's job."""
    from apache_beam.io.filesystems import FileSystems

    try:
        found = FileSystems.match([pattern])[0].metadata_list
    except Exception as error:  # Beam raises on a folder it cannot list (no bucket, no permission)
        raise NoVersionPointer(f"cannot list the model version pointers {pattern} ({error}). Fix: check the bucket "
                               "and the launcher's access to it.") from None
    if not found:
        raise NoVersionPointer(
            f"no model version pointer matches {pattern}: Beam's WatchFilePattern needs one before the job starts, "
            "or RunInference holds every prompt. Fix: launch through gpuflow (it writes the launch version's pointer "
            "first), or write a pointer (a JSON file with version, model_dir and state_dict_path) into that folder.")


def build_pipeline(
    pipeline: beam.Pipeline, args: argparse.Namespace, model_handler: ModelHandler | None = None
) -> None:
    streaming = bool(args.messages_subscription)
    handler = None if args.engine == "vllm" else model_handler or make_model_handler(args, streaming)
    if streaming:
        from apache_beam.io.gcp.pubsub import ReadFromPubSub

        records = (
            pipeline
            | "ReadPrompts" >> ReadFromPubSub(subscription=args.messages_subscription, with_attributes=True)
            | "ToRecord" >> beam.Map(pubsub_to_record)
        )
    else:
        lines = pipeline | "ReadPrompts" >> beam.io.ReadFromText(args.input, coder=beam.coders.BytesCoder())
        parsed = lines | "ParseLines" >> beam.FlatMap(parse_jsonl_line).with_outputs(
            ValidatePrompt.DEAD_LETTER, main="records")
        unique = (
            parsed.records
            | "GroupById" >> beam.GroupByKey()
            | "OnePerId" >> beam.FlatMap(first_of_each_id).with_outputs(ValidatePrompt.DEAD_LETTER, main="records")
        )
        bad_lines = (parsed[ValidatePrompt.DEAD_LETTER], unique[ValidatePrompt.DEAD_LETTER]) | "BadLines" >> beam.Flatten()
        records = unique.records

    validated = records | "Validate" >> beam.ParDo(
        ValidatePrompt(args.model_name, args.max_input_tokens, args.chat_template)
    ).with_outputs(ValidatePrompt.DEAD_LETTER, main="prompts")
    model_label = args.model_label or args.model_name
    if args.engine == "vllm":  # the server tokenizes by itself: the prompt's text goes, keyed by its id
        inputs = validated.prompts | "ToKeyedText" >> beam.Map(lambda element: (element[0], element[1]))
        run_inference = RunInference(model_handler or make_vllm_handler(args),
                                     inference_args=vllm_inference_args(args)).with_exception_handling()
        route = beam.FlatMap(route_completion, model=args.model_version or model_label)
    elif args.eval_rounds and not streaming:
        # The same batches in both versions' jobs, whatever their bundles (gpuflow.runs.rollout_gate pairs them).
        from evaluate_interleaved import FixedBatchHandler, fixed_batches

        inputs = (validated.prompts
                  | "AllPrompts" >> beam.combiners.ToList()
                  | "FixedBatches" >> beam.FlatMap(fixed_batches, args.max_batch_size, args.eval_rounds))
        run_inference = RunInference(FixedBatchHandler(handler)).with_exception_handling()
        route = beam.FlatMap(route_prediction)
    else:
        inputs = validated.prompts
        run_inference = RunInference(handler, model_metadata_pcoll=model_versions(pipeline, args, streaming)
                                     ).with_exception_handling()
        route = beam.FlatMap(route_prediction)
    if args.accelerator_hint:
        # Right fitting: only this step asks for the GPU; reading, validating and writing run on CPU workers.
        run_inference = run_inference.with_resource_hints(accelerator=args.accelerator_hint)
    predictions, failures = inputs | "RunInference" >> run_inference
    routed = predictions | "Route" >> route.with_outputs(ValidatePrompt.DEAD_LETTER, main="answers")
    failed_batches = failures.failed_inferences | "FailedBatches" >> beam.FlatMap(failed_batch_to_dead_letters)
    dead_letter_parts = [validated[ValidatePrompt.DEAD_LETTER], routed[ValidatePrompt.DEAD_LETTER], failed_batches]
    if not streaming:
        dead_letter_parts.append(bad_lines)
    dead_letters = dead_letter_parts | "AllDeadLetters" >> beam.Flatten()

    if streaming:
        from apache_beam.io.gcp.pubsub import WriteToPubSub

        _ = (
            routed.answers
            | "AnswerMessages" >> beam.Map(answer_to_pubsub)
            | "WriteAnswers" >> WriteToPubSub(args.responses_topic, with_attributes=True)
        )
        _ = (
            dead_letters
            | "DeadLetterMessages" >> beam.Map(dead_letter_to_pubsub)
            | "WriteDeadLetters" >> WriteToPubSub(args.dead_letter_topic, with_attributes=True)
        )
    else:
        answers_path, dead_letters_path, summary_path = output_paths(args.output, args.dead_letter_output)
        write_summary(pipeline, lines, routed.answers, dead_letters, summary_path)
        for label, collection, path in (
            ("Answers", routed.answers, answers_path),
            ("DeadLetters", dead_letters, dead_letters_path),
        ):
            _ = (
                collection
                | f"Format{label}" >> beam.Map(json.dumps)
                | f"Write{label}" >> beam.io.WriteToText(path, shard_name_template="", num_shards=1)
            )


def run(argv: Sequence[str] | None = None, save_main_session: bool = True, test_pipeline=None, model_handler=None,
        wait: bool = True):
    """Entry point, shaped like Beam's RunInference examples."""
    args, pipeline_args = parse_args(argv)
    options = PipelineOptions(pipeline_args)
    options.view_as(SetupOptions).save_main_session = save_main_session
    local_runner = "DirectRunner" in str(options.view_as(StandardOptions).runner or "DirectRunner")
    if local_runner and os.environ.get("STORAGE_EMULATOR_HOST"):  # the local profile only
        from storage_emulator import connect_anonymously

        connect_anonymously()
    if args.messages_subscription:
        options.view_as(StandardOptions).streaming = True
        if local_runner:
            from direct_runner_pull import shorten_direct_runner_pulls  # the local profile only

            shorten_direct_runner_pulls()
    pipeline = test_pipeline or beam.Pipeline(options=options)
    build_pipeline(pipeline, args, model_handler)
    if test_pipeline is not None:
        return None
    result = pipeline.run()
    # gpuflow's launcher waits for this line before it reports the pipeline as started.
    log.info("gpuflow: pipeline running (%s)", "streaming" if args.messages_subscription else "batch")
    if wait:  # a Flex Template launcher returns once the job is submitted
        result.wait_until_finish()
    return result


if __name__ == "__main__":
    import sys

    logging.getLogger().setLevel(logging.INFO)
    if "--interleaved-evaluation" in sys.argv:  # a rollout's local evaluation: its versions in this one process
        from evaluate_interleaved import run as evaluate_interleaved

        evaluate_interleaved(sys.argv[1:])
    else:
        run()
