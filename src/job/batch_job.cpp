// `strata run`: pass 1 over the input, the generator, and the three threads of pass 2 (read and
// tokenize ahead, generate length-aware blocks, detokenize and write behind). Per-request work
// lives beside it: PromptTokenizer here, make_gen_request and answer_line in answers.cpp.
#include "strata/job/batch_job.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <thread>
#include <variant>
#include <ctime>
#include <optional>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <fstream>
#include <sstream>

#include "strata/backend/backend.h"
#include "strata/core/error.h"
#include "strata/job/answers.h"
#include "strata/job/blocks.h"
#include "strata/job/engine_calibration.h"
#include "strata/job/output.h"
#include "strata/job/progress.h"
#include "strata/job/prompt_stream.h"
#include "strata/job/prompts.h"
#include "strata/model/model_loader.h"
#include "strata/core/size.h"
#include "strata/offload/engine.h"
#include "strata/policy/search.h"
#include "strata/profile/profiler.h"
#include "strata/policy/policy.h"
#include "strata/job/classify.h"
#include "strata/job/cross_encoder.h"
#include "strata/job/embeddings.h"
#include "strata/runtime/continuous.h"
#include "strata/runtime/embedder.h"
#include "strata/runtime/generator.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

// A request of this run, read and tokenized ahead of the engine by the reader thread.
struct Tokenized {
  PromptRecord record;
  std::vector<int32_t> ids;         // the prompt as the model reads it; empty with an error
  std::vector<std::vector<int32_t>> inputs;  // an embeddings request's: each input as the model reads it
  // A classification's pad tokens after the last one a classifier pools (not run; counted as usage).
  int64_t unpooled_pads = 0;
  std::optional<ServeError> error;  // OpenAI: answered with this error line instead
  int64_t seq = 0;                  // position among this run's requests, for --ordered
};

// Progress counts requests: one with several prompts counts once, at its first prompt's answer.
int64_t counts_once(const Tokenized& t) { return t.record.part == 0 ? 1 : 0; }

// Prompt -> token ids, as the model reads them (BOS, chat template). Used by pass 1 where a
// count must be exact, and by the reader thread for every request.
class PromptTokenizer {
public:
  // served_model: the name --lora NAME=DIR gives its adapter (empty: any request's model is served).
  // embedding_model: the model embeds by design (a pooling config, no LM head, or --pooling), so
  // scores and reranking over its vectors are served.
  PromptTokenizer(const ModelBundle& model, std::string file, ChatOptions defaults, std::string served_model = {},
                  bool embedding_model = false)
      : model_(model),
        file_(std::move(file)),
        defaults_(std::move(defaults)),
        served_model_(std::move(served_model)),
        embedding_model_(embedding_model) {}

  // The model's chat template, parsed on first use (nullopt: none, or one that cannot be used).
  const std::optional<ChatTemplate>& chat() const {
    std::call_once(chat_once_, [this] {
      if (model_.chat_template.empty()) return;
      try {
        chat_ = ChatTemplate::parse(model_.chat_template, model_.chat_tokens);
      } catch (const Error& e) {
        no_chat_ = std::string("'messages' given, but the model's chat template cannot be used: ") + e.what();
      }
    });
    return chat_;
  }

  // The ids of a servable request. One that cannot be served (no chat template, no tokens, fills
  // the context, a logit_bias or stop token past the vocabulary) throws "FILE:LINE: why" in the strata
  // format and returns the error for OpenAI.
  std::variant<std::vector<int32_t>, ServeError> tokenize(const PromptRecord& r) const {
    if (r.error) return *r.error;
    const std::string where = file_ + ":" + std::to_string(r.line);
    const bool openai = r.format == InputFormat::OpenAIBatch;
    auto unservable = [&](const std::string& code, const std::string& why) { return refusal(r, code, why); };
    const int vocab = model_.config.vocab_size;
    auto past_vocab = [&](const char* field, int32_t token) {
      return unservable("invalid_value", std::string(field) + " token " + std::to_string(token) +
                                             " is outside the model's vocabulary of " + std::to_string(vocab));
    };
    if (auto e = other_model(r)) return unservable(e->code, e->message);
    if (!model_.config.lm_head) return unservable("unsupported_model", no_head_reason());
    for (const auto& [token, bias] : r.sampling.logit_bias)
      if (token >= vocab) return past_vocab("logit_bias", token);
    for (int32_t token : r.sampling.stop_token_ids)
      if (token >= vocab) return past_vocab("stop_token_ids", token);
    if (!r.template_kwargs.empty() && !r.messages.empty() && chat() && chat()->format() != ChatFormat::Jinja)
      return unservable("unsupported_value",
                        std::string(openai ? "body." : "field '") + "chat_template_kwargs." +
                            r.template_kwargs[0].first + (openai ? "" : "'") +
                            " is not read: Strata renders this model's template family itself (enable_thinking and "
                            "reasoning_effort are read)");
    if (!r.tools.empty() && chat() && !chat()->renders_tools())
      return unservable("unsupported_value", std::string(openai ? "body.tools" : "field 'tools'") +
                                                 ": the model's chat template does not write tool definitions "
                                                 "(it never reads `tools`)");
    const ModelConfig& cfg = model_.config;
    auto fills_context = [&](size_t n) {
      return unservable("context_length_exceeded",
                        "prompt of " + std::to_string(n) + " tokens fills the model's context of " +
                            std::to_string(cfg.max_positions) +
                            (cfg.sliding_window > 0 ? " (its sliding-window attention is served within the window)" : ""));
    };
    if (!r.prompt_ids.empty()) {  // token ids, as given
      for (int32_t id : r.prompt_ids)
        if (id >= vocab) return past_vocab("body.prompt", id);
      if (int(r.prompt_ids.size()) >= cfg.max_positions + (r.prompt_logprobs >= 0))
        return fills_context(r.prompt_ids.size());
      return r.prompt_ids;
    }
    std::optional<std::string> text;
    try {
      text = render(r);
    } catch (const ChatTemplateError& e) {  // the template refuses the conversation
      return unservable("invalid_value", std::string("the model's chat template refuses these messages: ") + e.what());
    }
    if (!text) return unservable("unsupported_model", no_chat_);
    std::vector<int32_t> ids;
    // Rendered messages are tokenized as apply_chat_template does: the template writes any BOS.
    if (model_.add_bos && r.messages.empty()) ids.push_back(cfg.bos_id);
    const std::vector<int32_t> body = model_.tokenizer->encode(*text);
    ids.insert(ids.end(), body.begin(), body.end());
    if (ids.empty()) return unservable("invalid_value", "the prompt has no tokens");
    for (int32_t id : ids)
      if (id < 0 || id >= cfg.vocab_size)
        throw Error(where + ": token id " + std::to_string(id) + " outside the model's vocabulary of " +
                    std::to_string(cfg.vocab_size) + " (tokenizer does not match the model)");
    // A scored prompt may fill the context: its one drawn token is never fed back (start_sequence).
    if (int(ids.size()) >= cfg.max_positions + (r.prompt_logprobs >= 0)) return fills_context(ids.size());
    return ids;
  }

  // An embeddings request's inputs as the model reads them: a text as Hugging Face's tokenizer
  // encodes it with its special tokens (BOS, the post-processor's appended ids: vLLM's embeddings
  // endpoint and sentence-transformers alike), token ids as given. Errors as tokenize's.
  std::variant<std::vector<std::vector<int32_t>>, ServeError> tokenize_inputs(const PromptRecord& r,
                                                                             int64_t* unpooled_pads = nullptr) const {
    if (r.error) return *r.error;
    const bool openai = r.format == InputFormat::OpenAIBatch;
    auto unservable = [&](const std::string& code, const std::string& why) { return refusal(r, code, why); };
    if (auto e = other_model(r)) return unservable(e->code, e->message);
    if (auto e = wrong_kind(r)) return unservable(e->code, e->message);
    const ModelConfig& cfg = model_.config;
    const std::string field = openai ? "body." : "field '";
    const std::string end = openai ? "" : "'";
    const EmbeddingRequest& e = *r.embedding;
    if (e.use == EmbeddingUse::Classify) return classify_inputs(r, unpooled_pads);
    if (model_.classifier) return pair_inputs(r, unpooled_pads);
    // A score over embeddings means something only for a model trained to embed: a generative
    // checkpoint's last hidden states are not (a reranker such as Qwen3-Reranker scores with its LM
    // head: read as a cross-encoder through --hf-overrides' classifier_from_token).
    if (e.use != EmbeddingUse::Embed && !embedding_model_)
      return unservable("unsupported_model",
                        std::string(e.use == EmbeddingUse::Score ? "scores" : "reranking") +
                            " compare embeddings, and " + cfg.name +
                            " is a generative model with no pooling config (no modules.json or GGUF pooling_type); "
                            "give --pooling if it is an embedding model, or --hf-overrides with classifier_from_token if it is "
                            "a reranker that answers with tokens (docs/batch-format.md \"Cross-encoders\")");
    if (e.dimensions > cfg.hidden)
      return unservable("invalid_value", field + "dimensions" + end + " " + std::to_string(e.dimensions) +
                                             " exceeds the model's embedding width of " + std::to_string(cfg.hidden));
    // vLLM's truncate_prompt_tokens: -1 is the context; past it, an error (vLLM's too).
    const int64_t keep = e.truncate == -1 ? cfg.max_positions : e.truncate;
    const int64_t specials = model_.special_tokens();
    if (keep > cfg.max_positions || (keep > 0 && keep <= specials))
      return unservable("invalid_value", field + "truncate_prompt_tokens" + end + " " + std::to_string(keep) +
                                             (keep > cfg.max_positions
                                                  ? " exceeds the model's context of " + std::to_string(cfg.max_positions)
                                                  : " leaves no room for text beside the tokenizer's " +
                                                        std::to_string(specials) + " special tokens"));
    std::vector<std::vector<int32_t>> out;
    for (size_t i = 0; i < e.inputs.size(); ++i) {
      const std::string name = field + embedding_input_name(e, i) + end;
      std::vector<int32_t> ids = e.inputs[i].ids;
      if (!ids.empty() && keep > 0 && int64_t(ids.size()) > keep) ids.erase(ids.begin(), ids.end() - keep);
      if (ids.empty()) ids = model_.with_special_tokens(model_.tokenizer->encode(e.inputs[i].text), keep);
      if (auto err = input_error(name, ids)) return unservable(err->code, err->message);
      out.push_back(std::move(ids));
    }
    return out;
  }

  // An upper bound of the prompt's tokens without tokenizing: byte-level BPE makes at most one
  // token a byte, SentencePiece at most one a character plus its leading space; and the BOS
  // (a prompt's: rendered messages carry their own). nullopt when the messages cannot be rendered
  // (no usable template, or one that refuses them).
  std::optional<int64_t> token_bound(const PromptRecord& r) const {
    if (!r.prompt_ids.empty()) return int64_t(r.prompt_ids.size());  // used as given
    if (r.messages.empty()) return int64_t(r.prompt.size()) + 1 + (model_.add_bos ? 1 : 0);
    try {
      const std::optional<std::string> text = render(r);
      if (!text) return std::nullopt;
      return int64_t(text->size()) + 1;
    } catch (const ChatTemplateError&) {
      return std::nullopt;
    }
  }

  // Why a pooling request does not suit the model: a classification of a model without a
  // classifier's head, an embedding of a classifier, or a score or rerank of a classifier of more
  // than one label (a cross-encoder has one).
  std::optional<ServeError> wrong_kind(const PromptRecord& r) const {
    if (!r.embedding) return std::nullopt;
    const EmbeddingUse use = r.embedding->use;
    if (use == EmbeddingUse::Classify && !model_.classifier)
      return ServeError{"unsupported_model",
                        "classification needs a sequence classifier (config.json's architectures "
                        "*ForSequenceClassification, with a score.weight head); " + model_.config.name + " is not one"};
    if (use == EmbeddingUse::Embed && model_.classifier) return ServeError{"unsupported_model", no_head_reason()};
    if ((use == EmbeddingUse::Score || use == EmbeddingUse::Rerank) && model_.classifier &&
        model_.classifier->labels.size() != 1)
      return ServeError{"unsupported_model",
                        std::string(use == EmbeddingUse::Score ? "scores" : "reranking") + " of a classifier need one "
                            "label (a cross-encoder's relevance); " + model_.config.name + " has " +
                            std::to_string(model_.classifier->labels.size()) + " labels: classify instead"};
    return std::nullopt;
  }

  // Whether a request's inputs are pairs scored by a cross-encoder (always tokenized in pass 1).
  bool cross_encodes(const PromptRecord& r) const {
    return r.embedding && model_.classifier &&
           (r.embedding->use == EmbeddingUse::Score || r.embedding->use == EmbeddingUse::Rerank);
  }

  // The score template a cross-encoder's pairs are rendered with (--chat-template, as vLLM's).
  void set_score_template(std::optional<ChatTemplate> t) { score_template_ = std::move(t); }

  // What a model without an LM head serves instead of generating.
  std::string no_head_reason() const {
    if (model_.classifier && model_.classifier->labels.size() == 1)
      return model_.config.name + " is a one-label sequence classifier (a cross-encoder): it answers classification, "
                                  "score and rerank requests only (/v1/classify, /v1/score, /v1/rerank; the strata "
                                  "format's 'classify', 'text_1' and 'query' lines)";
    if (model_.classifier)
      return model_.config.name + " is a sequence classifier: it answers classification requests only (/v1/classify; "
                                  "the strata format's 'classify' lines)";
    return "the checkpoint has no lm_head.weight: an embedding model (or a truncated checkpoint), which serves "
           "embeddings requests only";
  }

  // An upper bound of an embeddings request's longest input, in tokens, without tokenizing.
  int64_t input_token_bound(const EmbeddingRequest& e) const {
    int64_t most = 0;
    for (const EmbeddingInput& in : e.inputs)
      most = std::max(most, in.ids.empty() ? int64_t(in.text.size()) + 1 + (model_.add_bos ? 1 : 0) +
                                                 int64_t(model_.append_ids.size())
                                           : int64_t(in.ids.size()));
    return most;
  }

private:
  // Why a pooled input's ids cannot run: an id past the vocabulary, more ids than the context.
  std::optional<ServeError> input_error(const std::string& name, const std::vector<int32_t>& ids) const {
    const ModelConfig& cfg = model_.config;
    for (int32_t id : ids)
      if (id >= cfg.vocab_size)
        return ServeError{"invalid_value", name + ": token id " + std::to_string(id) +
                                               " is outside the model's vocabulary of " + std::to_string(cfg.vocab_size)};
    if (int64_t(ids.size()) > cfg.max_positions)
      return ServeError{"context_length_exceeded", name + " of " + std::to_string(ids.size()) +
                                                       " tokens exceeds the model's context of " +
                                                       std::to_string(cfg.max_positions) + " tokens"};
    return std::nullopt;
  }

  // A classifier's input checked (input_error), then cut after its last id that is not the pad
  // token (ClassifierHead::pooled_length), the pads counted in `unpooled_pads`.
  std::optional<ServeError> classifier_input(const std::string& name, std::vector<int32_t>& ids,
                                             int64_t* unpooled_pads) const {
    if (auto err = input_error(name, ids)) return err;
    const size_t pooled = model_.classifier->pooled_length(ids);
    if (unpooled_pads) *unpooled_pads += int64_t(ids.size() - pooled);
    ids.resize(pooled);
    return std::nullopt;
  }

  // A classification's inputs: texts with the tokenizer's special tokens unless add_special_tokens
  // is false, ids as given, a conversation rendered by the chat template and tokenized as
  // apply_chat_template does; each cut to its last truncate_prompt_tokens ids, then after the last
  // id that is not the pad token (the one transformers' classifiers pool; a causal model's state
  // there does not depend on what follows), the pads counted in `unpooled_pads`.
  std::variant<std::vector<std::vector<int32_t>>, ServeError> classify_inputs(const PromptRecord& r,
                                                                              int64_t* unpooled_pads) const {
    const bool openai = r.format == InputFormat::OpenAIBatch;
    auto unservable = [&](const std::string& code, const std::string& why) { return refusal(r, code, why); };
    const ModelConfig& cfg = model_.config;
    const EmbeddingRequest& e = *r.embedding;
    const std::string field = openai ? "body." : "field '";
    const std::string end = openai ? "" : "'";
    const int64_t keep = e.truncate == -1 ? cfg.max_positions : e.truncate;
    if (keep > cfg.max_positions)
      return unservable("invalid_value", field + "truncate_prompt_tokens" + end + " " + std::to_string(keep) +
                                             " exceeds the model's context of " + std::to_string(cfg.max_positions));
    std::vector<std::vector<int32_t>> out;
    for (size_t i = 0; i < e.inputs.size(); ++i) {
      const std::string name = field + embedding_input_name(e, i) + end;
      std::vector<int32_t> ids = e.inputs[i].ids;
      if (ids.empty()) {
        std::optional<std::string> text = e.inputs[i].text;
        if (e.chat) {
          try {
            text = render(r, e.add_generation_prompt);
          } catch (const ChatTemplateError& err) {
            return unservable("invalid_value", std::string("the model's chat template refuses these messages: ") +
                                                   err.what());
          }
          if (!text) return unservable("unsupported_model", no_chat_);
        }
        // A text's special tokens are kept when it is cut, as the tokenizer truncating on the left
        // keeps them; a rendered conversation holds its own, and is cut like ids.
        const int64_t added = e.add_special_tokens ? model_.special_tokens() : 0;
        if (keep > 0 && keep <= added)
          return unservable("invalid_value", field + "truncate_prompt_tokens" + end + " " + std::to_string(keep) +
                                                 " leaves no room for text beside the tokenizer's " +
                                                 std::to_string(added) + " special tokens");
        ids = model_.tokenizer->encode(*text);
        if (e.add_special_tokens) ids = model_.with_special_tokens(std::move(ids), e.chat ? 0 : keep);
        if (ids.empty()) return unservable("invalid_value", name + " has no tokens");
      }
      if (keep > 0 && int64_t(ids.size()) > keep) ids.erase(ids.begin(), ids.end() - keep);
      if (auto err = classifier_input(name, ids, unpooled_pads)) return unservable(err->code, err->message);
      out.push_back(std::move(ids));
    }
    return out;
  }

  // A cross-encoder's inputs: each pair of the request (request_pairs) as one input
  // (cross_encoder_ids), cut after its last id that is not the pad token as classify_inputs cuts.
  std::variant<std::vector<std::vector<int32_t>>, ServeError> pair_inputs(const PromptRecord& r,
                                                                          int64_t* unpooled_pads) const {
    const bool openai = r.format == InputFormat::OpenAIBatch;
    auto unservable = [&](const std::string& code, const std::string& why) { return refusal(r, code, why); };
    const EmbeddingRequest& e = *r.embedding;
    const std::string field = openai ? "body." : "field '";
    const std::string end = openai ? "" : "'";
    const int64_t keep = e.truncate == -1 ? model_.config.max_positions : e.truncate;
    if (keep > model_.config.max_positions)
      return unservable("invalid_value", field + "truncate_prompt_tokens" + end + " " + std::to_string(keep) +
                                             " exceeds the model's context of " +
                                             std::to_string(model_.config.max_positions));
    std::vector<std::vector<int32_t>> out;
    for (const auto& [a, b] : request_pairs(e)) {
      const std::string name = field + embedding_input_name(e, a) + end + " and " + field +
                               embedding_input_name(e, b) + end;
      auto ids = cross_encoder_ids(model_, e.inputs[a].text, e.inputs[b].text,
                                   score_template_ ? &*score_template_ : nullptr, keep);
      if (auto* why = std::get_if<std::string>(&ids)) return unservable("invalid_value", name + ": " + *why);
      std::vector<int32_t>& pair = std::get<std::vector<int32_t>>(ids);
      if (auto err = classifier_input(name, pair, unpooled_pads)) return unservable(err->code, err->message);
      out.push_back(std::move(pair));
    }
    return out;
  }

  // A request that cannot be served: "FILE:LINE: why" thrown for a strata line (the job stops),
  // the error returned for an OpenAI one (answered with an error line).
  ServeError refusal(const PromptRecord& r, const std::string& code, const std::string& why) const {
    if (r.format != InputFormat::OpenAIBatch) throw Error(file_ + ":" + std::to_string(r.line) + ": " + why);
    return ServeError{code, why};
  }

  // vLLM serves a request with the adapter its body.model names and the base model otherwise;
  // a job merges one adapter into every weight, so a request for any other model is not its.
  std::optional<ServeError> other_model(const PromptRecord& r) const {
    if (r.format != InputFormat::OpenAIBatch || served_model_.empty() || r.model.empty() || r.model == served_model_)
      return std::nullopt;
    return ServeError{"model_not_found", "body.model '" + r.model + "' is not served by this job, which runs the LoRA "
                                             "adapter '" + served_model_ + "' (--lora " + served_model_ +
                                             "=DIR) merged into the model; answer its requests in another job"};
  }

  // The text to tokenize: the prompt itself, or the messages rendered with the model's chat
  // template (parsed on first use: an unsupported template fails only a job that needs it).
  std::optional<std::string> render(const PromptRecord& r, bool add_generation_prompt = true) const {
    if (r.messages.empty()) return r.prompt;
    if (!chat()) return std::nullopt;
    const ChatOptions options{r.reasoning_effort.empty() ? defaults_.reasoning_effort : r.reasoning_effort,
                              r.enable_thinking ? r.enable_thinking : defaults_.enable_thinking, r.tools,
                              r.template_kwargs};
    return chat_->render(r.messages, add_generation_prompt, options);
  }

  const ModelBundle& model_;
  std::string file_;
  ChatOptions defaults_;  // --reasoning-effort, --no-thinking
  std::string served_model_;
  bool embedding_model_ = false;
  mutable std::once_flag chat_once_;
  mutable std::optional<ChatTemplate> chat_;
  std::optional<ChatTemplate> score_template_;
  mutable std::string no_chat_ = "'messages' given, but the model has no chat template; give 'prompt'";
};

// Runs batches through either the resident generator or the offloading engine; the resident one
// also serves a window continuously (refill).
class Generator {
public:
  virtual ~Generator() = default;
  virtual size_t batch_size() const = 0;
  virtual std::vector<GenResult> run(const std::vector<GenRequest>& batch, GenStats& stats) = 0;
  virtual bool refills() const { return false; }
  // Serves `reqs` in order through batch_size() slots; `finished(i, results)` as request i ends.
  virtual void serve(const std::vector<GenRequest>&, const std::function<void(size_t, std::vector<GenResult>)>&,
                     GenStats&) {
    STRATA_FAIL("internal: this generator does not refill");
  }
  // One pooled vector per sequence (Embedder::embed); only the resident generator embeds.
  virtual std::vector<std::vector<float>> embed(std::span<const std::vector<int32_t>>, PoolingKind) {
    STRATA_FAIL("internal: embeddings run on the resident model");
  }
  virtual EmbedStats embed_stats() const { return {}; }
  virtual void finish(std::ostream&) {}
};

class ResidentGenerator final : public Generator {
public:
  ResidentGenerator(ModelBundle& model, const JobOptions& opt, std::ostream& log)
      : backend_(make_backend(opt.device, opt.threads, gpu_activation_dtype(opt.dtype, model.config.checkpoint_dtype))),
        batch_(size_t(opt.batch_size)),
        refill_(opt.refill) {
    log << "model " << model.config.name << " (" << model.config.n_layers << " layers, "
        << double(model.config.param_count()) / 1e9 << " B parameters) on " << backend_label(*backend_) << "\n";
    transformer_ = std::make_unique<Transformer>(
        model.config, load_model_weights(model.config, *model.weights, *backend_, opt.threads), *backend_);
    options_.prefill_token_budget = opt.prefill_token_budget;
    options_.share_prefixes = opt.share_prefixes;
    options_.kept_prefixes = &kept_prefixes_;
  }
  size_t batch_size() const override { return batch_; }
  std::vector<GenResult> run(const std::vector<GenRequest>& batch, GenStats& stats) override {
    return generate(*transformer_, batch, options_, &stats);
  }
  bool refills() const override { return refill_; }
  std::vector<std::vector<float>> embed(std::span<const std::vector<int32_t>> seqs, PoolingKind pooling) override {
    if (!embedder_) embedder_ = std::make_unique<Embedder>(*transformer_, options_.prefill_token_budget);
    return embedder_->embed(seqs, pooling);
  }
  EmbedStats embed_stats() const override { return embedder_ ? embedder_->stats() : EmbedStats{}; }
  void serve(const std::vector<GenRequest>& reqs, const std::function<void(size_t, std::vector<GenResult>)>& finished,
             GenStats& stats) override {
    ContinuousOptions o;
    o.slots = int(batch_);
    o.gen = options_;
    // A request's choices decode together: as a block grows for them, so do the slots.
    for (const GenRequest& r : reqs) o.slots = std::max(o.slots, r.n);
    // Slots as long as the window's longest prompt and answer: a window's cache, sized like a block's.
    for (size_t i = 0; i < reqs.size(); ++i)
      o.capacity = std::max(o.capacity, int(reqs[i].prompt.size()) +
                                            std::max(start_sequence(reqs[i], transformer_->config(), 0, i).max_new, 0));
    size_t next = 0;
    run_continuous(
        *transformer_, o, [&] { return next < reqs.size() ? Admission{&reqs[next], next++} : Admission{}; }, finished,
        &stats);
  }

private:
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Transformer> transformer_;
  std::unique_ptr<Embedder> embedder_;  // made by the first embeddings request
  GenOptions options_;
  KeptPrefixes kept_prefixes_;  // the instructions blocks begin with, each computed once
  size_t batch_;
  bool refill_;
};

void print_report(const OffloadReport& r, std::ostream& log) {
  auto gbps = [](const LinkStats& l) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(3) << double(l.bytes) / 1e9 << " GB in " << l.seconds << " s ("
       << std::setprecision(2) << l.gb_per_s() << " GB/s)";
    return os.str();
  };
  const GenStats& g = r.gen;
  const double gen_s = g.prefill_seconds + g.decode_seconds;
  auto rate = [](double n, double s) { return s > 0 ? n / s : 0.0; };
  log << std::fixed << std::setprecision(2) << "report:\n"
      << "  throughput: prefill " << rate(double(g.prompt_tokens), g.prefill_seconds) << " prompt tok/s"
      << (g.shared_prompt_tokens > 0 ? " (" + std::to_string(g.shared_prompt_tokens) + " copied from shared prefixes)"
                                     : std::string())
      << ", decode "
      << rate(double(g.generated_tokens), g.decode_seconds) << " tok/s, total "
      << rate(double(g.generated_tokens), gen_s) << " generated tok/s (generated / (prefill + decode time))\n"
      << "  busy: compute " << r.compute_busy << " s, cpu->gpu " << r.h2d_busy << " s, gpu->cpu " << r.d2h_busy
      << " s, disk " << r.disk_busy << " s; schedule wall " << r.schedule_seconds << " s; overlap "
      << std::setprecision(0) << 100 * r.overlap() << "%\n"
      << std::setprecision(2) << "  host waits: "
      << rate(double(r.decode_host_waits), double(g.decode_steps)) << " per decode step ("
      << rate(double(r.decode_device_waits), double(g.decode_steps)) << " for the device), " << std::setprecision(3)
      << r.host_wait_seconds << " s in all\n";
  if (r.cpu_attention_seconds > 0)
    log << std::setprecision(2) << "  cpu attention: " << r.cpu_attention_bytes / 1e9 << " GB of cache in "
        << r.cpu_attention_seconds << " s (" << rate(r.cpu_attention_bytes / 1e9, r.cpu_attention_seconds)
        << " GB/s on its own lane), " << std::setprecision(0)
        << 100 * r.cpu_attention_seconds / std::max(r.schedule_seconds, 1e-9) << "% of the schedule's wall time\n";
  if (r.cpu_experts_seconds > 0)
    log << std::setprecision(2) << "  cpu experts: " << r.cpu_experts_seconds << " s of MLP halves on the CPU lane, "
        << std::setprecision(0) << 100 * r.cpu_experts_seconds / std::max(r.schedule_seconds, 1e-9)
        << "% of the schedule's wall time\n";
  if (r.graph_replays > 0) log << "  cuda graphs: " << r.graph_replays << " layer halves replayed from a captured graph\n";
  log << std::setprecision(2)
      << "  disk->cpu: " << gbps(r.disk_to_cpu) << "\n  cpu->gpu:  " << gbps(r.cpu_to_gpu)
      << "\n  gpu->cpu:  " << gbps(r.gpu_to_cpu) << "\n  cpu->disk: " << gbps(r.cpu_to_disk) << "\n"
      << "  peak memory: gpu " << format_bytes(r.peak.gpu) << ", cpu (pinned) " << format_bytes(r.peak.cpu)
      << ", disk " << format_bytes(r.peak.disk) << (r.disk_io.empty() ? "" : " via " + r.disk_io)
      << " reserved; used " << format_bytes(r.used.gpu) << ", " << format_bytes(r.used.cpu) << ", "
      << format_bytes(r.used.disk) << "\n";
}

class OffloadGenerator final : public Generator {
public:
  OffloadGenerator(ModelBundle& model, const JobOptions& opt, const PlanShape& shape, size_t prompts, std::ostream& log)
      : backend_(make_backend(opt.device, opt.threads, gpu_activation_dtype(opt.dtype, model.config.checkpoint_dtype))),
        opt_(opt) {
    OffloadOptions o;
    if (!opt.gpu_mem.empty()) o.gpu_budget = double(parse_size(opt.gpu_mem, "--gpu-mem"));
    if (!opt.cpu_mem.empty()) o.cpu_budget = double(parse_size(opt.cpu_mem, "--cpu-mem"));
    if (!opt.disk_mem.empty()) o.disk_budget = double(parse_size(opt.disk_mem, "--disk-mem"));
    o.offload_dir = opt.offload_dir;
    o.policy = opt.policy == "auto" ? choose_policy(model, o, shape, prompts, log) : load_policy(opt.policy);
    if (opt.no_overlap) o.policy.overlap = false;
    if (opt.prefill_tokens_given) o.policy.prefill_tokens = int(std::min<int64_t>(opt.prefill_token_budget, 1 << 24));
    o.trace = !opt.trace.empty();
    o.cpu_threads = opt.threads;
    o.share_prefixes = opt.share_prefixes;
    log << "model " << model.config.name << " (" << model.config.n_layers << " layers, "
        << double(model.config.param_count()) / 1e9 << " B parameters) on " << backend_label(*backend_) << ", policy "
        << opt.policy.string() << ": block " << o.policy.gpu_batch_size << " x " << o.policy.num_gpu_batches
        << ", prompt <= " << shape.prompt_len << ", generation <= " << shape.gen_len
        << ", prefill steps of <= " << o.policy.prefill_step_tokens() << " tokens"
        << (o.policy.overlap ? "" : ", no overlap") << "\n";
    const PlacementPlan plan = plan_placement(model.config, o.policy, shape, backend_->activation_dtype());
    if (opt.verbose || opt.report) log << "placement:\n" << describe_plan(plan, o.policy);
    // Placing a large model (reading it, writing its disk share) takes minutes: say how far it is.
    const auto t0 = Clock::now();
    double last = 0;
    const bool progress = opt.progress;
    o.on_layer_loaded = [&log, t0, &last, progress](int done, int total) {
      const double t = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!progress || (t - last < 5.0 && done < total) || t < 2.0) return;
      last = t;
      log << "[strata] placing weights: " << done << "/" << total << " layers, " << std::fixed << std::setprecision(0)
          << t << " s\n";
    };
    engine_ = std::make_unique<OffloadEngine>(model.config, *model.weights, *backend_, o, shape);
    num_gpu_batches_ = o.policy.num_gpu_batches;
    if (o.policy.compress_weights) log << describe_weight_codes(engine_->report(), *o.policy.compress_weights) << "\n";
  }
  size_t batch_size() const override { return size_t(engine_->block_size()); }
  std::vector<GenResult> run(const std::vector<GenRequest>& batch, GenStats& stats) override {
    return engine_->generate(batch, &stats);
  }
  // Continuous batching needs each request's choices in one GPU batch; a job with more runs blocks.
  bool refills() const override { return refill_; }
  void refill_unless_choices_exceed(int max_n, int line, const std::string& file, std::ostream& log) {
    const int gbs = engine_->block_size() / num_gpu_batches_;
    refill_ = opt_.refill && max_n <= gbs;
    if (opt_.refill && !refill_)
      log << file << ":" << line << ": n = " << max_n << " choices exceed the GPU batch of " << gbs
          << ": the job runs blocks (continuous batching keeps a request's choices in one GPU batch)\n";
  }
  void serve(const std::vector<GenRequest>& reqs, const std::function<void(size_t, std::vector<GenResult>)>& finished,
             GenStats& stats) override {
    size_t next = 0;
    engine_->serve([&] { return next < reqs.size() ? Admission{&reqs[next], next++} : Admission{}; }, finished,
                   &stats);
  }
  // --policy auto: this machine's profile (measured once and cached), the tier budgets, and the
  // cost model's search for this job's longest prompt and generation.
  HardwareProfile machine_profile(std::ostream& log) {
    ProfileOptions p;
    p.backend = backend_->device() == Device::CUDA ? "cuda" : "cpu";
    p.offload_dir = opt_.offload_dir;
    p.threads = opt_.threads;
    p.refine = engine_refinement();
    return cached_or_measured_profile(p, log, "policy auto");
  }

  Policy choose_policy(const ModelBundle& model, const OffloadOptions& o, const PlanShape& shape, size_t prompts,
                       std::ostream& log) {
    const ModelConfig& cfg = model.config;
    const HardwareProfile hw = machine_profile(log);
    SearchOptions s;
    s.workload = {shape.prompt_len, std::max(shape.gen_len, 1)};
    s.budget = default_budgets(*backend_, o);
    s.allow_compression = opt_.allow_compression;
    s.kept_codes = kept_codes_compression(model.weights->codes_spec());
    if (backend_->device() == Device::CPU) {
      // The cost model counts fp16 bytes; the CPU backend keeps fp32, and its "gpu" and "cpu"
      // tiers share host memory: give each half of it, in fp16-equivalent bytes.
      const double host = std::min(s.budget.gpu, s.budget.cpu) / 2;
      s.budget.gpu = std::min(s.budget.gpu, host) / 2;
      s.budget.cpu = std::min(s.budget.cpu, host) / 2;
    }
    const SearchResult r = search_policy(cfg, hw, s);
    const Candidate& best = r.ranked.front();
    Policy chosen = best.policy;
    // A job smaller than the block: shrink the block to it (less memory, same schedule).
    if (prompts > 0 && prompts < size_t(chosen.block_size())) {
      chosen.gpu_batch_size = int(std::min<size_t>(size_t(chosen.gpu_batch_size), prompts));
      chosen.num_gpu_batches = int((prompts + size_t(chosen.gpu_batch_size) - 1) / size_t(chosen.gpu_batch_size));
    }
    log << "policy auto (" << hw.name << ", prompt " << s.workload.prompt_len << ", generation " << s.workload.gen_len
        << (s.allow_compression ? ", compression allowed" : "") << "): predicted " << std::fixed
        << std::setprecision(2) << best.prediction.throughput_tok_s
        << " tok/s, search " << std::setprecision(3) << r.seconds << " s\n"
        << (chosen.block_size() < best.policy.block_size() ? "(block shrunk to the job's " + std::to_string(prompts) + " prompts)\n" : "")
        << policy_to_yaml(chosen);
    return chosen;
  }

  void finish(std::ostream& log) override {
    if (opt_.report) print_report(engine_->report(), log);
    if (!opt_.trace.empty()) {
      engine_->write_trace(opt_.trace);
      log << "wrote trace " << opt_.trace.string() << "\n";
    }
  }

private:
  std::unique_ptr<Backend> backend_;
  const JobOptions& opt_;
  std::unique_ptr<OffloadEngine> engine_;
  int num_gpu_batches_ = 1;
  bool refill_ = false;
};

// What pass 1 learns beside the checks: this shard's requests, and for --policy the exact
// longest prompt and generation (the engine's plan) of the requests it will serve.
struct JobScan {
  PromptScan file;
  int64_t mine = 0;      // this shard's requests
  int64_t servable = 0;  // --policy: those the engine will run
  int64_t sequences = 0;  // --policy: their choices (n each)
  int max_n = 1, max_n_line = 0;  // --policy: the most choices of one request, and its line
  int64_t tokenized = 0;  // requests pass 1 had to tokenize
  PlanShape shape;       // --policy: their longest prompt and generation
  int64_t embeddings = 0;  // this shard's embeddings requests
  int embedding_line = 0;  // the first one's line
};

// Pass 1. Tokenizes only where a count must be exact: a strata prompt that might fill the
// context (its byte bound reaches it), and under --policy a prompt that might be the job's
// longest or have its generation cut by the context; and a strata prompt with a logit bias or stop
// token ids, whose ids tokenize() checks against the vocabulary. Everything else is checked untokenized.
JobScan scan_job(const JobOptions& opt, const Shard& shard, const ModelBundle& model, const PromptTokenizer& tok,
                 std::ostream& log) {
  JobScan s;
  const int ctx = model.config.max_positions;
  const bool plan = !opt.policy.empty();
  s.file = scan_prompts(
      opt.prompts, opt.defaults, [&](const std::string& w) { log << "warning: " << w << "\n"; },
      [&](const PromptRecord& r) {
        if (!in_shard(r, shard)) return;
        ++s.mine;
        if (r.error) return;
        if (r.embedding) {
          ++s.embeddings;
          if (s.embedding_line == 0) s.embedding_line = r.line;
          // A strata line that cannot be served fails the job here: inputs that might not fit, ids,
          // a truncation (checked against the context and the special tokens).
          const bool ids = std::any_of(r.embedding->inputs.begin(), r.embedding->inputs.end(),
                                       [](const EmbeddingInput& in) { return !in.ids.empty(); });
          if (r.format == InputFormat::Strata && (ids || r.embedding->truncate != 0 || r.embedding->chat ||
                                                  tok.wrong_kind(r) || tok.cross_encodes(r) ||
                                                  tok.input_token_bound(*r.embedding) > ctx)) {
            ++s.tokenized;
            tok.tokenize_inputs(r);
          }
          return;
        }
        if (r.format == InputFormat::Strata && !model.config.lm_head)
          throw Error(opt.prompts.string() + ":" + std::to_string(r.line) + ": " + model.config.name +
                      (model.classifier ? model.classifier->labels.size() == 1
                                              ? " is a one-label sequence classifier (a cross-encoder): it answers "
                                                "'classify', 'text_1' (scores) and 'query' (reranking) lines only"
                                              : " is a sequence classifier: it answers 'classify' lines only"
                                        : " has no lm_head.weight (an embedding model): it answers 'input' lines "
                                          "(embeddings) only"));
        auto scan_prompt = [&](const PromptRecord& p) {
          const std::optional<int64_t> bound = tok.token_bound(p);
          const int max_new = p.sampling.max_new_tokens;
          const bool strata_check =
              p.format == InputFormat::Strata &&
              (!bound || *bound >= ctx || !p.sampling.logit_bias.empty() || !p.sampling.stop_token_ids.empty());
          const bool plan_check = plan && (!bound || *bound > s.shape.prompt_len || int64_t(max_new) > ctx - *bound);
          int64_t len = -1;  // unknown, but at most *bound
          if (strata_check || plan_check) {
            ++s.tokenized;
            const auto ids = tok.tokenize(p);  // throws for a strata line that cannot be served
            if (std::holds_alternative<ServeError>(ids)) return;  // OpenAI: an error line in pass 2
            len = int64_t(std::get<std::vector<int32_t>>(ids).size());
          }
          if (!plan) return;
          ++s.servable;
          s.sequences += p.n;
          if (p.n > s.max_n) s.max_n = p.n, s.max_n_line = p.line;
          if (len >= 0) {
            s.shape.prompt_len = std::max(s.shape.prompt_len, int(len));
            s.shape.gen_len = std::max(s.shape.gen_len, std::min(max_new, ctx - int(len)));
          } else {
            s.shape.gen_len = std::max(s.shape.gen_len, max_new);
          }
        };
        if (r.prompts.empty()) return scan_prompt(r);
        for (const PromptRecord& p : completion_parts(r)) scan_prompt(p);  // each prompt of the request
      },
      opt.threads);
  if (s.servable == 0) s.shape = {1, 1};
  return s;
}

// A request on its way to the writer thread: its answer's results, or none for an error line.
// Thrown from a continuous run's callback when the writer thread has stopped on an error: the run
// stops and the writer's error is reported.
struct WriterGone {};

struct Finished {
  Tokenized request;
  std::vector<GenResult> results;
  std::vector<std::vector<float>> embeddings;  // an embeddings request's: one pooled vector per input
};

// The reader thread (pass 2): this shard's requests not answered yet, tokenized, in file order,
// into `ahead`, which holds at most a window of them. Returns what stopped it, if anything.
std::exception_ptr read_ahead(const JobOptions& opt, const Shard& shard, const PromptTokenizer& tok,
                              const std::function<bool(const PromptRecord&)>& done, BoundedQueue<Tokenized>& ahead,
                              std::atomic<int64_t>& skipped) {
  std::exception_ptr error;
  try {
    PromptReader in(opt.prompts, opt.defaults);
    int64_t seq = 0;
    while (std::optional<PromptRecord> r = in.next()) {
      if (!in_shard(*r, shard)) continue;
      if (done(*r)) {
        ++skipped;
        continue;
      }
      if (r->embedding) {
        Tokenized t;
        t.seq = seq++;
        auto inputs = tok.tokenize_inputs(*r, &t.unpooled_pads);
        if (auto* e = std::get_if<ServeError>(&inputs)) t.error = std::move(*e);
        else t.inputs = std::move(std::get<std::vector<std::vector<int32_t>>>(inputs));
        t.record = std::move(*r);
        if (!ahead.push(std::move(t))) break;  // the engine stopped
        continue;
      }
      // A completions request with several prompts goes as one request a prompt, under one seq;
      // the writer joins their lines (write_behind, join_prompt_lines).
      std::vector<PromptRecord> parts;
      if (r->prompts.empty()) parts.push_back(std::move(*r));
      else parts = completion_parts(*r);
      bool stopped = false;
      for (PromptRecord& p : parts) {
        Tokenized t;
        t.seq = seq;
        auto ids = tok.tokenize(p);
        if (auto* e = std::get_if<ServeError>(&ids)) {
          t.error = std::move(*e);
          if (p.parts > 1) t.error->message = "body.prompt[" + std::to_string(p.part) + "]: " + t.error->message;
        } else {
          t.ids = std::move(std::get<std::vector<int32_t>>(ids));
        }
        t.record = std::move(p);
        if (!ahead.push(std::move(t))) {  // the engine stopped
          stopped = true;
          break;
        }
      }
      ++seq;
      if (stopped) break;
    }
  } catch (...) {
    error = std::current_exception();
  }
  ahead.close();
  return error;
}

// The writer thread's files and what it reports.
struct WriteBehind {
  OutputWriter& out;
  OutputWriter* errors;  // --errors, else error lines go to `out`
  bool ordered;
  Clock::time_point start;
  std::atomic<int64_t> errors_written{0}, reorder_peak{0};
  std::atomic<double> first_answer{-1};  // seconds from `start` until the first line was flushed
};

// The writer thread: builds each finished request's line (detokenizing) and writes it. With
// --ordered, a reorder buffer holds lines back until every earlier one is written; a window is
// finished before the next starts, so it holds at most one window. Flushes after each block, or
// once a second while blocks queue up faster than the disk syncs.
std::exception_ptr write_behind(BoundedQueue<std::vector<Finished>>& behind, WriteBehind& w,
                                const std::function<nlohmann::json(const Finished&)>& line_of) {
  std::exception_ptr error;
  try {
    std::map<int64_t, std::pair<nlohmann::json, bool>> held;  // seq -> line, is an error line
    // A request with several prompts (PromptRecord::parts): its prompts' lines by seq, and how many
    // have come, until the last joins them into its one line.
    std::map<int64_t, std::pair<std::vector<nlohmann::json>, int>> joining;
    int64_t next = 0;
    bool wrote = false;
    auto put = [&](const nlohmann::json& line, bool is_error) {
      (is_error && w.errors ? *w.errors : w.out).write(line);
      if (is_error) ++w.errors_written;
      wrote = true;
    };
    auto flush = [&] {
      w.out.flush();
      if (w.errors) w.errors->flush();
    };
    auto last_flush = Clock::now();
    while (std::optional<std::vector<Finished>> task = behind.pop()) {
      for (const Finished& f : *task) {
        bool is_error = f.request.error.has_value();
        nlohmann::json line = line_of(f);
        if (const PromptRecord& r = f.request.record; r.parts > 1) {
          auto& [lines, have] = joining[f.request.seq];
          lines.resize(size_t(r.parts));
          lines[size_t(r.part)] = std::move(line);
          if (++have < r.parts) continue;
          line = join_prompt_lines(std::move(lines));
          joining.erase(f.request.seq);
          is_error = !line["error"].is_null();
        }
        if (!w.ordered) {
          put(line, is_error);
          continue;
        }
        held.emplace(f.request.seq, std::make_pair(std::move(line), is_error));
        w.reorder_peak = std::max<int64_t>(w.reorder_peak, int64_t(held.size()));
        for (auto it = held.begin(); it != held.end() && it->first == next; it = held.erase(it), ++next)
          put(it->second.first, it->second.second);
      }
      if (w.first_answer < 0 || behind.size() == 0 || Clock::now() - last_flush > std::chrono::seconds(1)) {
        flush();
        last_flush = Clock::now();
        if (w.first_answer < 0 && wrote) w.first_answer = std::chrono::duration<double>(Clock::now() - w.start).count();
      }
    }
    flush();
  } catch (...) {
    error = std::current_exception();
    behind.abandon();  // the engine's next push fails, and it stops
  }
  return error;
}

// How the job pools embeddings: the model's (modules.json, a GGUF's pooling_type; else the last
// token, normalized), with --pooling and --normalize / --no-normalize taking over where given.
PoolingConfig job_pooling(const JobOptions& opt, const ModelBundle& model) {
  PoolingConfig p = model.pooling.value_or(PoolingConfig{});
  if (!opt.pooling.empty()) {
    p.kind = parse_pooling_kind(opt.pooling, "--pooling");
    p.source = "--pooling";
  }
  if (opt.normalize) {
    p.normalize = *opt.normalize;
    p.source += std::string(p.source.empty() ? "" : ", ") + (*opt.normalize ? "--normalize" : "--no-normalize");
  }
  return p;
}

// The job's options with the model's recommended sampling settings taken (--generation-config
// auto), said once in the log.
JobOptions with_model_sampling(const JobOptions& options, const RecommendedSampling& model, std::ostream& log) {
  JobOptions opt = options;
  if (!opt.model_sampling || model.empty()) return opt;
  const std::vector<std::string> taken = take_recommended_sampling(opt.defaults, model, opt.defaults_given);
  if (taken.empty()) return opt;
  log << "sampling defaults from " << model.source << ":";
  for (size_t i = 0; i < taken.size(); ++i) log << (i ? ", " : " ") << taken[i];
  log << " (request fields and flags override them; --generation-config none keeps Strata's)\n";
  return opt;
}

}  // namespace

std::vector<std::string> take_recommended_sampling(SamplingParams& defaults, const RecommendedSampling& model,
                                                   const std::set<std::string>& given) {
  std::vector<std::string> taken;
  auto take = [&](const char* field, const auto& value, auto& into) {
    if (!value || given.count(field)) return;
    into = *value;
    std::ostringstream os;
    os << field << " " << *value;
    taken.push_back(os.str());
  };
  take("temperature", model.temperature, defaults.temperature);
  take("top_p", model.top_p, defaults.top_p);
  take("top_k", model.top_k, defaults.top_k);
  take("min_p", model.min_p, defaults.min_p);
  take("repetition_penalty", model.repetition_penalty, defaults.repetition_penalty);
  take("max_new_tokens", model.max_new_tokens, defaults.max_new_tokens);
  return taken;
}

JobSummary run_batch_job(const JobOptions& options, std::ostream& log) {
  if (options.batch_size < 1) STRATA_FAIL("--batch-size must be at least 1, got " << options.batch_size);
  if (const std::string why = stop_strings_error(options.stop); !why.empty()) STRATA_FAIL("--stop " << why);
  if (options.window < 0) STRATA_FAIL("--window must be >= 0 (0: the default), got " << options.window);
  if (options.allow_compression && options.policy != "auto")
    STRATA_FAIL("--compress is for --policy auto (a policy file gives its own compress_weights and compress_kv_cache)");
  const auto wall0 = Clock::now();
  const Shard shard = options.shard.empty() ? Shard{} : parse_shard(options.shard);
  if (!options.errors.empty() &&
      std::filesystem::weakly_canonical(options.errors) == std::filesystem::weakly_canonical(options.out))
    STRATA_FAIL("--errors must name another file than --out (without --errors, error lines go to --out)");
  ModelBundle model = open_model(options.model, options.tokenizer, options.lora, options.hf_overrides);
  if (!options.chat_template.empty()) model.chat_template = read_chat_template(options.chat_template);
  if (!model.tokenizer) STRATA_FAIL(options.model << ": the model has no tokenizer files; pass --tokenizer DIR");
  if (!model.load_note.empty()) log << model.load_note << "\n";
  const JobOptions opt = with_model_sampling(options, model.sampling, log);
  PromptTokenizer tokenizer(model, opt.prompts.string(),
                            ChatOptions{opt.reasoning_effort, opt.no_thinking ? std::optional<bool>(false) : std::nullopt, {}, {}},
                            opt.lora_name, model.pooling.has_value() || !model.config.lm_head || !opt.pooling.empty());
  // vLLM renders a cross-encoder's pairs with --chat-template when one is given (its messages have
  // the roles "query" and "document"), never with the model's own template.
  if (!opt.chat_template.empty() && model.classifier && model.classifier->labels.size() == 1) {
    try {
      tokenizer.set_score_template(ChatTemplate::interpreted(model.chat_template, model.chat_tokens));
    } catch (const Error& e) {
      STRATA_FAIL(opt.chat_template.string() << ": the score template cannot be used: " << e.what());
    }
  }
  const PromptTokenizer& tok = tokenizer;

  // Pass 1: check every line before touching the device or the output.
  const JobScan scan = scan_job(opt, shard, model, tok, log);
  const bool openai = scan.file.format == InputFormat::OpenAIBatch;
  if (!opt.errors.empty() && scan.file.requests > 0 && !openai)
    STRATA_FAIL("--errors is for OpenAI batch files; " << opt.prompts.string() << " is in the strata format");
  if (!opt.shard.empty())
    log << "shard " << opt.shard << ": " << scan.mine << " of " << scan.file.requests << " requests\n";
  if (opt.progress)
    log << "checked " << scan.file.requests << " requests in " << std::fixed << std::setprecision(2)
        << scan.file.seconds << " s"
        << (scan.tokenized > 0 ? " (tokenized " + std::to_string(scan.tokenized) + " of them" +
                                     (opt.policy.empty() ? " that might fill the context)" : " to plan the engine)")
                               : std::string())
        << "\n";

  if (scan.embeddings > 0 && !opt.policy.empty())
    STRATA_FAIL(opt.prompts.string() << ":" << scan.embedding_line
                                     << (model.classifier ? ": a classification request: classifications run on the resident "
                                                      "model; drop --policy (the offloading engine generates only)"
                                                    : ": an embeddings request: embeddings run on the resident model; drop "
                                                      "--policy (the offloading engine generates only)"));
  if (!model.config.lm_head && !opt.policy.empty())
    STRATA_FAIL(opt.model << (model.classifier ? ": a sequence classifier" : ": the checkpoint has no lm_head.weight "
                                                                            "(an embedding model)")
                          << "; --policy generates, which needs an LM head");
  if (model.classifier && (!opt.pooling.empty() || opt.normalize))
    STRATA_FAIL((opt.pooling.empty() ? (*opt.normalize ? "--normalize" : "--no-normalize") : "--pooling")
                << " is for embedding models; " << model.config.name
                << " is a sequence classifier, which scores the last token that is not the pad token");
  const PoolingConfig pooling = job_pooling(opt, model);
  const ClassifierHead* classifier = model.classifier ? &*model.classifier : nullptr;
  if (scan.embeddings > 0 && classifier) {
    log << "classification: " << classifier->labels.size() << " label" << (classifier->labels.size() == 1 ? "" : "s")
        << " (";
    for (size_t i = 0; i < std::min<size_t>(classifier->labels.size(), 8); ++i)
      log << (i ? ", " : "") << classifier->labels[i];
    log << (classifier->labels.size() > 8 ? ", ..." : "") << "), " << activation_name(classifier->activation)
        << ", the last token that is not the pad token scored (" << classifier->source << ")\n";
    if (!classifier->made_from.empty()) log << "classifier head: " << classifier->made_from << "\n";
    if (classifier->labels.size() == 1)
      log << "score and rerank pairs: "
          << (!opt.chat_template.empty() ? "rendered by the score template " + opt.chat_template.string()
              : classifier->pair_separator ? std::string("tokenizer(text_1, text_2), the tokenizer's pair template")
                                           : std::string("text_1 + text_2, one text"))
          << "\n";
  } else if (scan.embeddings > 0) {
    log << "embeddings: " << pooling_name(pooling.kind) << " pooling, " << (pooling.normalize ? "" : "not ")
        << "normalized (" << (pooling.source.empty() ? "no pooling config: vLLM's default for a decoder"
                                                    : pooling.source) << ")\n";
  }

  // Load before touching the output, so a model that fails to load (or a policy that does not
  // fit) leaves no file behind.
  std::unique_ptr<Generator> gen;
  if (opt.policy.empty()) gen = std::make_unique<ResidentGenerator>(model, opt, log);
  else {
    // A request's n choices are n sequences of the engine's block, and they run in one block.
    auto offload = std::make_unique<OffloadGenerator>(model, opt, scan.shape, size_t(scan.sequences), log);
    offload->refill_unless_choices_exceed(scan.max_n, scan.max_n_line, opt.prompts.string(), log);
    gen = std::move(offload);
    if (size_t(scan.max_n) > gen->batch_size())
      STRATA_FAIL(opt.prompts.string() << ":" << scan.max_n_line << ": n = " << scan.max_n
                                       << " choices exceed the policy's block of " << gen->batch_size()
                                       << " sequences; a request's choices run in one block");
  }
  model.weights.reset();  // the mapping is no longer needed once the weights are in their tiers

  OutputWriter writer(opt.out);
  std::unique_ptr<OutputWriter> error_writer;  // --errors: a second resumable file
  if (!opt.errors.empty()) error_writer = std::make_unique<OutputWriter>(opt.errors);
  // Only the finished ids of earlier runs are kept: the output files' done sets.
  auto done = [&](const PromptRecord& r) {
    if (writer.done_ids().empty() && (!error_writer || error_writer->done_ids().empty())) return false;
    const IdSet::Hash h = IdSet::hash(r.id_key);
    return writer.done_ids().contains(h) || (error_writer && error_writer->done_ids().contains(h));
  };
  const int64_t done_before = std::min<int64_t>(
      scan.mine, int64_t(writer.done_ids().size() + (error_writer ? error_writer->done_ids().size() : 0)));
  if (done_before > 0)
    log << "resuming " << writer.partial_path().string() << ": " << done_before << " of " << scan.mine
        << " prompts already done\n";
  const int64_t created = int64_t(std::time(nullptr));
  AnswerSettings answers = answer_settings(*model.tokenizer, opt.stop, model.config.name, created,
                                           opt.response_format, opt.json_schema);
  answers.end_ids.assign(model.config.eos_ids.begin(), model.config.eos_ids.end());
  answers.default_pattern = opt.pattern;
  const ChatTemplate* chat = tok.chat() ? &*tok.chat() : nullptr;
  if (chat) answers.think = ThinkTokens::of(*chat, *model.tokenizer);  // none: answers read as text
  answers.thinking_off = opt.no_thinking;
  if (chat) answers.tool_calls = tool_call_format(*chat, opt.tool_call_parser);
  // GPT-OSS's template, or an interpreted one that writes harmony channels (GPT-OSS's, edited).
  const bool harmony_channels = chat && chat->format() == ChatFormat::Jinja &&
                                chat->source().find("<|channel|>") != std::string::npos;
  if (harmony_channels) answers.harmony = HarmonyTokens::of(*model.tokenizer);  // none: answers as text
  if (chat && chat->format() == ChatFormat::Harmony) {
    answers.harmony = HarmonyTokens::of(*model.tokenizer);
    if (!answers.harmony)
      STRATA_FAIL(opt.model << ": the chat template is GPT-OSS's harmony format, but the tokenizer lacks one of "
                               "<|start|>, <|end|>, <|message|>, <|channel|>, <|constrain|>, <|return|>, <|call|>");
  }

  const size_t block = gen->batch_size();
  const size_t window = opt.window > 0 ? size_t(opt.window) : std::max<size_t>(8 * block, 4096);
  JobSummary sum;
  sum.prompts = scan.mine;
  sum.in_file = scan.file.requests;
  sum.scan_seconds = scan.file.seconds;
  sum.window = int64_t(window);

  // Reader thread: pass 2, tokenizing up to a window ahead of the engine.
  BoundedQueue<Tokenized> ahead(window);
  std::exception_ptr reader_error, writer_error;
  std::atomic<int64_t> skipped{0}, scored_prompts{0}, scored_positions{0};
  std::thread reader([&] { reader_error = read_ahead(opt, shard, tok, done, ahead, skipped); });

  // Writer thread: detokenizes, builds the lines and writes them, in completion or input order.
  BoundedQueue<std::vector<Finished>> behind(4);
  WriteBehind wb{writer, error_writer.get(), opt.ordered, wall0};
  std::thread writer_thread([&] {
    writer_error = write_behind(behind, wb, [&](const Finished& f) {
      const PromptRecord& r = f.request.record;
      if (f.request.error) return openai_error_line(r, *f.request.error);
      if (r.embedding) {
        int64_t tokens = f.request.unpooled_pads;
        for (const std::vector<int32_t>& in : f.request.inputs) tokens += int64_t(in.size());
        if (r.embedding->use == EmbeddingUse::Classify)
          return classification_line(r, f.embeddings, *classifier, tokens, model.config.name, created);
        if (classifier) return cross_encoder_line(r, f.embeddings, *classifier, tokens, model.config.name, created);
        return embedding_line(r, f.embeddings, tokens, pooling.normalize, model.config.name, created);
      }
      if (r.prompt_logprobs >= 0) {
        ++scored_prompts;
        scored_positions += int64_t(f.request.ids.size()) - 1;
      }
      return answer_line(r, int64_t(f.request.ids.size()), f.results, answers, f.request.ids);
    });
  });
  auto stop_threads = [&] {
    ahead.abandon();
    behind.close();
    reader.join();
    writer_thread.join();
  };

  // The engine, on this thread: a window of requests, sorted by length and cut into blocks.
  GenStats stats;
  Progress progress(log, opt.progress);
  ProgressState ps;
  ps.total = std::max<int64_t>(0, scan.mine - done_before);
  int64_t windowed = 0, runs = 0;
  bool writer_gone = false;  // a push failed: the writer thread stopped on an error
  // Embeds the window's embeddings requests `which`, a chunk at a time (whole requests, about 16
  // prefill budgets of tokens: enough to pack steps by length, little to hold), each chunk's lines
  // to the writer as it ends. False when the writer has stopped.
  auto embed_items = [&](std::vector<Tokenized>& items, const std::vector<size_t>& which) {
    const int64_t chunk_tokens = 16 * std::max<int64_t>(opt.prefill_token_budget, 1);
    for (size_t begin = 0; begin < which.size();) {
      size_t end = begin;
      int64_t tokens = 0;
      std::vector<std::vector<int32_t>> seqs;
      for (; end < which.size() && (end == begin || tokens < chunk_tokens); ++end)
        for (std::vector<int32_t>& in : items[which[end]].inputs) {
          tokens += int64_t(in.size());
          seqs.push_back(std::move(in));
        }
      // A classifier scores the last token of what classify_inputs kept.
      std::vector<std::vector<float>> vectors = gen->embed(seqs, classifier ? PoolingKind::Last : pooling.kind);
      std::vector<Finished> finished;
      size_t at = 0;
      for (size_t k = begin; k < end; ++k) {
        Finished f{std::move(items[which[k]]), {}, {}};
        for (std::vector<int32_t>& in : f.request.inputs) {  // each input's ids back, for the usage count
          in = std::move(seqs[at]);
          f.embeddings.push_back(std::move(vectors[at++]));
        }
        finished.push_back(std::move(f));
      }
      if (!behind.push(std::move(finished))) return false;
      ps.done += int64_t(end - begin);
      ps.tokens += tokens;
      ps.blocks_done = ps.done, ps.blocks_planned = ps.total;  // the ETA by requests
      progress.update(ps);
      begin = end;
    }
    return true;
  };
  try {
    while (!writer_gone) {
      std::vector<Tokenized> items;
      while (items.size() < window) {
        std::optional<Tokenized> t = ahead.pop();
        if (!t) break;
        items.push_back(std::move(*t));
      }
      if (items.empty()) break;
      windowed += int64_t(items.size());
      sum.window_peak = std::max(sum.window_peak, int64_t(items.size()));
      std::vector<Finished> errors;
      std::vector<size_t> work, embeds;  // items to generate for, items to embed
      std::vector<int> lengths, choices;
      for (size_t i = 0; i < items.size(); ++i)
        if (items[i].error) errors.push_back({std::move(items[i]), {}, {}});
        else if (items[i].record.embedding) embeds.push_back(i);
        else work.push_back(i), lengths.push_back(int(items[i].ids.size())), choices.push_back(items[i].record.n);
      if (!errors.empty()) {
        for (const Finished& f : errors) ps.done += counts_once(f.request);
        if (!behind.push(std::move(errors))) break;  // the writer failed
      }
      if (!embeds.empty() && !embed_items(items, embeds)) break;  // the writer failed
      if (work.empty()) continue;  // a window of error lines and embeddings only: nothing to generate
      if (gen->refills()) {
        // Continuous batching: the window's requests in input order, each taking a slot as one frees.
        std::vector<GenRequest> reqs;
        for (size_t k : work) reqs.push_back(make_gen_request(items[k].record, items[k].ids, answers));
        try {
          gen->serve(reqs, [&](size_t i, std::vector<GenResult> results) {
            runs += int64_t(results.size());
            for (const GenResult& r : results) ps.tokens += int64_t(r.tokens.size());
            const int64_t counted = counts_once(items[work[i]]);
            std::vector<Finished> one;
            one.push_back({std::move(items[work[i]]), std::move(results), {}});
            if (!behind.push(std::move(one))) throw WriterGone{};
            ps.done += counted;
            ps.blocks_done = ps.done, ps.blocks_planned = ps.total;  // the ETA by requests
            progress.update(ps);
          }, stats);
        } catch (const WriterGone&) {
          writer_gone = true;
        }
        continue;
      }
      const std::vector<std::vector<size_t>> blocks = length_blocks(lengths, block, choices);
      sum.padding_input_order.add(input_order_padding(lengths, block));
      ps.blocks_planned = ps.blocks_done + int64_t(blocks.size()) +
                          (std::max<int64_t>(0, ps.total - windowed) + int64_t(block) - 1) / int64_t(block);
      for (const std::vector<size_t>& b : blocks) {
        sum.padding.add_block(lengths, b);
        std::vector<GenRequest> batch;
        std::vector<size_t> counts;
        for (size_t k : b) {
          const Tokenized& t = items[work[k]];
          batch.push_back(make_gen_request(t.record, t.ids, answers));
          counts.push_back(size_t(batch.back().n));  // the generator answers each choice
        }
        std::vector<GenResult> results = gen->run(batch, stats);
        for (size_t c : counts) runs += int64_t(c);  // sequences: each choice's first token is prefill's
        std::vector<Finished> finished;
        size_t at = 0;
        int64_t counted = 0;
        for (size_t j = 0; j < b.size(); ++j) {
          counted += counts_once(items[work[b[j]]]);
          Finished f{std::move(items[work[b[j]]]), {}, {}};
          for (size_t c = 0; c < counts[j]; ++c) f.results.push_back(std::move(results[at++]));
          finished.push_back(std::move(f));
        }
        if (!behind.push(std::move(finished))) {
          writer_gone = true;
          break;
        }
        ++ps.blocks_done;
        ++sum.blocks;
        ps.done += counted;
        ps.tokens = stats.generated_tokens + gen->embed_stats().tokens;
        progress.update(ps);
      }
    }
  } catch (...) {
    stop_threads();
    progress.end();
    throw;  // the finished blocks are in OUT.partial for a rerun
  }
  stop_threads();  // the reader is done, or must stop where the writer failed
  const EmbedStats embedded = gen->embed_stats();
  ps.tokens = stats.generated_tokens + embedded.tokens;
  progress.update(ps, true);
  progress.end();
  if (writer_error) std::rethrow_exception(writer_error);
  if (reader_error) std::rethrow_exception(reader_error);
  // Both files reach the disk before either is renamed: a write that fails leaves both .partial.
  writer.flush();
  if (error_writer) error_writer->flush();
  writer.finish();
  if (error_writer) error_writer->finish();
  gen->finish(log);

  sum.errors = wb.errors_written;
  sum.refilled = gen->refills();
  sum.occupancy = stats.occupancy();
  sum.resumed = skipped;
  sum.reorder_peak = wb.reorder_peak;
  sum.first_answer_seconds = wb.first_answer;
  if (sum.errors > 0)
    log << sum.errors << " request" << (sum.errors == 1 ? "" : "s") << " cannot be served: error lines in "
        << (error_writer ? opt.errors : opt.out).string() << "\n";
  sum.prompt_tokens = stats.prompt_tokens;
  sum.shared_prompt_tokens = stats.shared_prompt_tokens;
  sum.generated_tokens = stats.generated_tokens;
  sum.prefill_seconds = stats.prefill_seconds;
  sum.decode_seconds = stats.decode_seconds;
  sum.embedded_inputs = embedded.sequences;
  sum.embedded_tokens = embedded.tokens;
  sum.embed_seconds = embedded.seconds;
  sum.scored_prompts = scored_prompts;
  sum.scored_positions = scored_positions;
  sum.wall_seconds = std::chrono::duration<double>(Clock::now() - wall0).count();
  auto rate = [](double n, double s) { return s > 0 ? n / s : 0.0; };
  const double gen_s = sum.prefill_seconds + sum.decode_seconds;
  log << std::fixed << std::setprecision(2) << "prompts: " << sum.prompts << " (" << sum.resumed << " resumed"
      << (sum.errors > 0 ? ", " + std::to_string(sum.errors) + " answered with an error" : std::string()) << ")"
      << (opt.shard.empty() ? std::string() : " in shard " + opt.shard + " of " + std::to_string(sum.in_file)) << "\n";
  if (sum.embedded_inputs > 0)
    log << (classifier ? "classified: " : "embeddings: ") << sum.embedded_inputs << " inputs, " << sum.embedded_tokens << " tokens in "
        << sum.embed_seconds << " s, " << rate(double(sum.embedded_tokens), sum.embed_seconds) << " tok/s (wall "
        << sum.wall_seconds << " s, first answer after " << sum.first_answer_seconds << " s)\n";
  if (sum.embedded_inputs > 0 && runs == 0) {  // an embeddings job: no generation to report
    log << "wrote " << opt.out.string() << "\n";
    return sum;
  }
  log << "prompt tokens: " << sum.prompt_tokens << ", generated tokens: " << sum.generated_tokens
      << "\nprefill: " << sum.prefill_seconds << " s, " << rate(double(sum.prompt_tokens), sum.prefill_seconds)
      << " tok/s"
      << (sum.shared_prompt_tokens > 0 ? " (" + std::to_string(sum.shared_prompt_tokens) +
                                             " prompt tokens copied from shared prefixes, not computed)"
                                       : std::string())
      << "\ndecode: " << sum.decode_seconds << " s, "
      << rate(double(sum.generated_tokens - runs), sum.decode_seconds) << " tok/s\ntotal: " << gen_s << " s, "
      << rate(double(sum.generated_tokens), gen_s) << " generated tok/s (wall " << sum.wall_seconds
      << " s, first answer after " << sum.first_answer_seconds << " s)\n";
  if (sum.scored_prompts > 0)
    log << "prompt logprobs: " << sum.scored_positions << " positions of " << sum.scored_prompts
        << " prompts scored (in the prefill time above)\n";
  if (sum.refilled)
    log << "continuous batching: " << block << " slots, occupancy " << 100 * sum.occupancy
        << "% (slots decoding a live sequence per decode step)\n";
  else
    log << "padding efficiency: " << sum.padding.efficiency() << " in " << sum.blocks << " blocks of <= " << block
        << " (prompt tokens / block rows x longest prompt; " << sum.padding_input_order.efficiency()
        << " in input order); occupancy " << 100 * sum.occupancy
        << "% (slots decoding a live sequence per decode step)\n";
  if (stats.routing.layer_steps > 0) {
    const RoutingTotals& r = stats.routing;
    const double tokens = double(r.tokens) / double(r.layer_steps);
    const ModelConfig& cfg = model.config;
    log << "experts: " << double(r.active_experts) / double(r.layer_steps) << " of " << cfg.n_experts
        << " active per sparse layer step, " << tokens << " tokens a step (" << cfg.experts_per_token
        << " each; uniform routing would activate "
        << expected_active_experts(cfg.n_experts, cfg.experts_per_token, tokens) << ")\n";
  }
  log << "wrote " << opt.out.string() << "\n";
  return sum;
}

}  // namespace strata
