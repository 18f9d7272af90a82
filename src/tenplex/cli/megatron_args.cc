#include "tenplex/cli/megatron_args.h"

#include <algorithm>
#include <cstdlib>
#include <map>

namespace tenplex::cli {
namespace {

enum class Arity { kFlag, kOne, kMany };

// Megatron-LM training arguments that do not change which tensors a rank holds.
const std::map<std::string, Arity>& Ignored() {
  static const std::map<std::string, Arity> table = {
      // batches, schedule, optimizer hyper-parameters
      {"--seq-length", Arity::kOne},
      {"--micro-batch-size", Arity::kOne},
      {"--global-batch-size", Arity::kOne},
      {"--rampup-batch-size", Arity::kMany},
      {"--train-iters", Arity::kOne},
      {"--train-samples", Arity::kOne},
      {"--lr", Arity::kOne},
      {"--min-lr", Arity::kOne},
      {"--lr-decay-style", Arity::kOne},
      {"--lr-decay-iters", Arity::kOne},
      {"--lr-decay-samples", Arity::kOne},
      {"--lr-warmup-fraction", Arity::kOne},
      {"--lr-warmup-iters", Arity::kOne},
      {"--lr-warmup-samples", Arity::kOne},
      {"--weight-decay", Arity::kOne},
      {"--clip-grad", Arity::kOne},
      {"--adam-beta1", Arity::kOne},
      {"--adam-beta2", Arity::kOne},
      {"--adam-eps", Arity::kOne},
      {"--sgd-momentum", Arity::kOne},
      {"--init-method-std", Arity::kOne},
      {"--attention-dropout", Arity::kOne},
      {"--hidden-dropout", Arity::kOne},
      {"--seed", Arity::kOne},
      {"--norm-epsilon", Arity::kOne},
      {"--rotary-percent", Arity::kOne},
      {"--rotary-base", Arity::kOne},
      {"--loss-scale", Arity::kOne},
      {"--initial-loss-scale", Arity::kOne},
      {"--min-loss-scale", Arity::kOne},
      {"--loss-scale-window", Arity::kOne},
      {"--hysteresis", Arity::kOne},
      // parallelism (the config is given to tenplex separately)
      {"--tensor-model-parallel-size", Arity::kOne},
      {"--pipeline-model-parallel-size", Arity::kOne},
      {"--context-parallel-size", Arity::kOne},
      {"--num-layers-per-virtual-pipeline-stage", Arity::kOne},
      {"--distributed-backend", Arity::kOne},
      {"--distributed-timeout-minutes", Arity::kOne},
      {"--sequence-parallel", Arity::kFlag},
      {"--use-distributed-optimizer", Arity::kFlag},
      {"--overlap-grad-reduce", Arity::kFlag},
      {"--overlap-param-gather", Arity::kFlag},
      // data, tokenizer, checkpoints, logging
      {"--data-path", Arity::kMany},
      {"--split", Arity::kOne},
      {"--data-cache-path", Arity::kOne},
      {"--tokenizer-type", Arity::kOne},
      {"--tokenizer-model", Arity::kOne},
      {"--vocab-file", Arity::kOne},
      {"--merge-file", Arity::kOne},
      {"--num-workers", Arity::kOne},
      {"--dataloader-type", Arity::kOne},
      {"--mock-data", Arity::kFlag},
      {"--save", Arity::kOne},
      {"--load", Arity::kOne},
      {"--save-interval", Arity::kOne},
      {"--ckpt-format", Arity::kOne},
      {"--no-load-optim", Arity::kFlag},
      {"--no-load-rng", Arity::kFlag},
      {"--no-save-optim", Arity::kFlag},
      {"--no-save-rng", Arity::kFlag},
      {"--finetune", Arity::kFlag},
      {"--use-checkpoint-args", Arity::kFlag},
      {"--eval-interval", Arity::kOne},
      {"--eval-iters", Arity::kOne},
      {"--log-interval", Arity::kOne},
      {"--tensorboard-dir", Arity::kOne},
      {"--wandb-project", Arity::kOne},
      {"--exit-interval", Arity::kOne},
      {"--exit-duration-in-mins", Arity::kOne},
      {"--log-throughput", Arity::kFlag},
      {"--log-timers-to-tensorboard", Arity::kFlag},
      // kernels and numerics that keep the tensors as they are
      {"--transformer-impl", Arity::kOne},
      {"--attention-backend", Arity::kOne},
      {"--recompute-granularity", Arity::kOne},
      {"--recompute-method", Arity::kOne},
      {"--recompute-num-layers", Arity::kOne},
      {"--use-flash-attn", Arity::kFlag},
      {"--use-mcore-models", Arity::kFlag},
      {"--attention-softmax-in-fp32", Arity::kFlag},
      {"--accumulate-allreduce-grads-in-fp32", Arity::kFlag},
      {"--no-masked-softmax-fusion", Arity::kFlag},
      {"--no-bias-gelu-fusion", Arity::kFlag},
      {"--no-bias-swiglu-fusion", Arity::kFlag},
      {"--no-bias-dropout-fusion", Arity::kFlag},
      {"--no-gradient-accumulation-fusion", Arity::kFlag},
      {"--no-rope-fusion", Arity::kFlag},
      {"--apply-query-key-layer-scaling", Arity::kFlag},
      {"--use-cpu-initialization", Arity::kFlag},
      {"--squared-relu", Arity::kFlag},
      {"--no-async-tensor-model-parallel-allreduce", Arity::kFlag},
      {"--bias-gelu-fusion", Arity::kFlag},
  };
  return table;
}

// Arguments that would add tensors the model description does not have.
const std::map<std::string, std::string>& Unsupported() {
  static const std::map<std::string, std::string> table = {
      {"--num-experts", "mixture-of-experts layers"},
      {"--qk-layernorm", "query/key layer norms"},
      {"--add-qkv-bias", "QKV biases without the other linear biases"},
  };
  return table;
}

bool Given(const std::vector<std::string>& flags, const char* name) {
  return std::find(flags.begin(), flags.end(), name) != flags.end();
}

// One extra argument: "--name" or "--name=value" (inline).
struct ExtraArg {
  std::string name, value;
  bool has_inline = false;
};

ExtraArg SplitInline(const std::string& arg) {
  ExtraArg a;
  a.name = arg;
  a.has_inline = a.name.rfind("--", 0) == 0 && a.name.find('=') != std::string::npos;
  if (a.has_inline) {
    a.value = a.name.substr(a.name.find('=') + 1);
    a.name = a.name.substr(0, a.name.find('='));
  }
  return a;
}

// The Megatron-LM flags that change the model (dtype, GQA, position embeddings):
// true when `a` is one, applied to args (GQA only noted in *gqa).
Result<bool> ApplyShapeFlag(const ExtraArg& a, const std::vector<std::string>& extras,
                            const std::vector<std::string>& explicit_flags, GptArgs* args,
                            bool* gqa, MegatronExtras* out) {
  const std::string& name = a.name;
  if (name == "--bf16" || name == "--fp16") {
    if (!Given(explicit_flags, "--params-dtype")) args->params_dtype = name.substr(2);
    out->ignored.push_back(name + " (params dtype " + args->params_dtype + ")");
    return true;
  }
  if (name == "--group-query-attention") {
    *gqa = true;
    return true;
  }
  if (name == "--use-rotary-position-embeddings") {
    args->position_embedding_type = "rope";
    return true;
  }
  if (name == "--no-position-embedding") {
    if (args->position_embedding_type != "rope" &&
        std::find(extras.begin(), extras.end(), "--use-rotary-position-embeddings") ==
            extras.end()) {
      return InvalidArgument(
          "--no-position-embedding without --use-rotary-position-embeddings (or "
          "--position-embedding-type rope): "
          "a GPT without any position information is not supported");
    }
    return true;
  }
  return false;
}

// An ignored argument as shown in the list of ignored ones, with its value(s): taken from
// extras after index *i (advanced past them) unless inline. *one_value: the value of an
// argument of arity one.
Result<std::string> TakeIgnored(const ExtraArg& a, Arity arity,
                                const std::vector<std::string>& extras, std::size_t* i,
                                std::string* one_value) {
  std::string shown = a.name;
  if (arity == Arity::kOne) {
    if (a.has_inline) {
      *one_value = a.value;
    } else if (*i + 1 >= extras.size() || extras[*i + 1].rfind("--", 0) == 0) {
      return InvalidArgument(a.name + " needs a value");
    } else {
      *one_value = extras[++*i];
    }
    shown += " " + *one_value;
  } else if (arity == Arity::kMany) {
    if (a.has_inline) shown += " " + a.value;
    while (!a.has_inline && *i + 1 < extras.size() && extras[*i + 1].rfind("--", 0) != 0)
      shown += " " + extras[++*i];
  } else if (a.has_inline) {
    return InvalidArgument(a.name + " is a flag and takes no value (got '" + a.value + "')");
  }
  return shown;
}

// After every argument: unknown ones are an error; GQA without --num-query-groups has
// one group, and --seq-length sets --max-position-embeddings unless that was given.
Status FinishMegatronArgs(const std::vector<std::string>& unknown, bool gqa,
                          const std::string& seq_length,
                          const std::vector<std::string>& explicit_flags, GptArgs* args,
                          MegatronExtras* out) {
  if (!unknown.empty()) {
    std::string list;
    for (const auto& u : unknown) list += (list.empty() ? "" : " ") + u;
    return InvalidArgument(
        "unknown argument(s) for `tenplex model gpt`: " + list +
        " (model-shape options are in `tenplex model gpt --help`; Megatron-LM training "
        "arguments that do not change the state are accepted and ignored)");
  }
  if (gqa && !Given(explicit_flags, "--num-query-groups"))
    args->num_query_groups = 1;  // Megatron's default
  if (!seq_length.empty() && !Given(explicit_flags, "--max-position-embeddings")) {
    char* end = nullptr;
    const long long n = std::strtoll(seq_length.c_str(), &end, 10);
    if (end == seq_length.c_str() || *end != '\0' || n <= 0) {
      return InvalidArgument("--seq-length must be a positive integer (got '" + seq_length + "')");
    }
    args->max_position_embeddings = n;
    out->max_positions_from_seq = true;
  }
  return Status::Ok();
}

}  // namespace

Result<MegatronExtras> ApplyMegatronArgs(const std::vector<std::string>& extras,
                                         const std::vector<std::string>& explicit_flags,
                                         GptArgs* args) {
  MegatronExtras out;
  std::vector<std::string> unknown;
  std::string seq_length;
  bool gqa = false;
  for (std::size_t i = 0; i < extras.size(); ++i) {
    const ExtraArg a = SplitInline(extras[i]);
    TP_ASSIGN_OR_RETURN(bool applied, ApplyShapeFlag(a, extras, explicit_flags, args, &gqa, &out));
    if (applied) continue;
    if (auto u = Unsupported().find(a.name); u != Unsupported().end()) {
      return InvalidArgument(a.name + ": " + u->second +
                             " are not supported by `tenplex model gpt`");
    }
    auto it = Ignored().find(a.name);
    if (it == Ignored().end()) {
      unknown.push_back(extras[i]);
      continue;
    }
    std::string value;
    TP_ASSIGN_OR_RETURN(std::string shown, TakeIgnored(a, it->second, extras, &i, &value));
    if (a.name == "--seq-length") seq_length = value;
    out.ignored.push_back(shown);
  }
  TP_RETURN_IF_ERROR(FinishMegatronArgs(unknown, gqa, seq_length, explicit_flags, args, &out));
  return out;
}

}  // namespace tenplex::cli
