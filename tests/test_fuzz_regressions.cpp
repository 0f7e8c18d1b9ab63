// Inputs the libFuzzer targets in fuzz/ found (docs/fuzzing.md lists them): each made a parser
// of outside bytes fail with something other than strata::Error. They must now be refused with
// a strata::Error that names the source and the line.
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/job/prompts.h"
#include "strata/model/chat_template.h"
#include "strata/model/config.h"
#include "strata/model/safetensors.h"
#include "strata/model/tokenizer.h"
#include "strata/policy/policy.h"
#include "strata/profile/hardware.h"
#include "test_paths.h"

using namespace strata;

TEST_CASE("fuzz finding 1: a prompt line with a number out of double range is invalid JSON, not a crash", "[job][fuzz]") {
  // nlohmann::json throws out_of_range (not parse_error) for 1e400; it escaped read_prompts.
  for (const char* line : {R"({"id": 1, "prompt": "Hello", "top_p": 1e400})",
                           R"({"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "x", "temperature": -1e999}})"}) {
    std::istringstream in(std::string("\n") + line + "\n");
    REQUIRE_THROWS_AS(read_prompts(in, "in.jsonl", SamplingParams{}), Error);
    std::istringstream again(std::string("\n") + line + "\n");
    CHECK_THROWS_WITH(read_prompts(again, "in.jsonl", SamplingParams{}),
                      Catch::StartsWith("in.jsonl:2: invalid JSON") && Catch::Contains("number overflow"));
  }
}

TEST_CASE("fuzz finding 2: a YAML key that is a map, a list or null is refused, not a crash", "[policy][hardware][fuzz]") {
  // YAML::TypedBadConversion escaped the readers' unknown-key check (key.as<std::string>()).
  const std::string policy_rest = "gpu_batch_size: 8\nnum_gpu_batches: 2\nweights: {gpu: 100}\nkv_cache: {gpu: 100}\n";
  for (const std::string& bad : {std::string("{cpu: 100}: 1\n"), std::string("? [a, b]\n: 1\n"), std::string("~: 1\n"),
                                 std::string("activations: {gpu: 100, &x {a: 1}: 2}\n")}) {
    REQUIRE_THROWS_AS(parse_policy(policy_rest + bad, "p.yaml"), Error);
    CHECK_THROWS_WITH(parse_policy(policy_rest + bad, "p.yaml"), Catch::Contains("keys are field names"));
  }
  // The crashing input itself: an anchor before a flow map turned the map into a key.
  CHECK_THROWS_WITH(parse_policy("{gpu_batch_size: 8, weights: {gpu: 50, cpu: 50}, &kv_cache: {cpu: 100}, x: 1}", "p.yaml"),
                    Catch::StartsWith("p.yaml:1: a key is a map, a list or null"));
  CHECK_THROWS_WITH(parse_hardware_profile("gpu_mem: 1GiB\n[1]: 2\n", "hw.yaml"),
                    Catch::StartsWith("hw.yaml:2: a key is a map, a list or null"));
  const std::string hw_rest = "gpu_mem: 1GB\ncpu_mem: 1GB\ndisk_mem: 1GB\ncpu_to_gpu_bw: 1GB/s\ngpu_to_cpu_bw: 1GB/s\n"
                              "disk_to_cpu_bw: 1GB/s\ncpu_to_disk_bw: 1GB/s\ngpu_attention_bw: 1GB/s\n"
                              "cpu_attention_bw: 1GB/s\ncpu_flops: 1e12\n";
  REQUIRE_NOTHROW(parse_hardware_profile(hw_rest + "gpu_gemm: [{tokens: 1, flops_per_s: 1e12}]\n", "hw.yaml"));
  CHECK_THROWS_WITH(parse_hardware_profile(hw_rest + "gpu_gemm: [{tokens: 1, {x: 1}: 2}]\n", "hw.yaml"),
                    Catch::Contains("a key in 'gpu_gemm[0]' is a map"));
}

TEST_CASE("fuzz finding 3: a tokenizer.json id far beyond the vocabulary is refused, not gigabytes allocated", "[tokenizer][fuzz]") {
  // {"e": 727418249} made load_vocab resize its id table to 727 million strings (out of memory);
  // an added token with id -1 asked finish() for 2^64 slots.
  auto tokenizer = [](const std::string& vocab, const std::string& added) {
    return R"({"model": {"type": "BPE", "vocab": )" + vocab + R"(, "merges": []}, "added_tokens": )" + added +
           R"(, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}})";
  };
  CHECK_THROWS_WITH(Tokenizer::from_tokenizer_json_text(tokenizer(R"({"a": 0, "e": 727418249})", "[]"), "t.json"),
                    Catch::Contains("t.json: model.vocab gives token 'e' the id 727418249"));
  for (const char* id : {"-1", "2147483647", "1e300", "\"3\""})
    CHECK_THROWS_WITH(Tokenizer::from_tokenizer_json_text(
                          tokenizer(R"({"a": 0})", std::string(R"([{"id": )") + id + R"(, "content": "<x>"}])"), "t.json"),
                      Catch::Contains("t.json: added_tokens[0] has the id"));
  // Holes and added tokens past the vocabulary stay allowed (LLaMA-3 adds 256 ids after 128000).
  const Tokenizer ok = Tokenizer::from_tokenizer_json_text(
      tokenizer(R"({"a": 0, "b": 5})", R"([{"id": 900, "content": "<x>", "special": true}])"), "t.json");
  CHECK(ok.vocab_size() == 901);
  CHECK(ok.encode("a<x>b") == std::vector<int32_t>{0, 900, 5});
}

TEST_CASE("fuzz finding 4: config.json numbers of the wrong type or size are refused, not a crash", "[config][fuzz]") {
  // eos_token_id ["a"] let nlohmann's type_error escape; head_dim 1e300 was converted to int
  // (undefined behaviour); 4294967360 was truncated to 64; a huge layer count overflowed
  // param_count(). Each is now a strata::Error naming the file and the field.
  const std::string base = R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 80, )"
                           R"("num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, )";
  auto parse = [&](const std::string& rest) { return config_from_hf_json_text(base + rest + "}", "m/config.json"); };
  REQUIRE(parse(R"("eos_token_id": [1, 2])").eos_ids == std::vector<int>{1, 2});
  CHECK_THROWS_WITH(parse(R"("eos_token_id": ["a"])"),
                    Catch::StartsWith("m/config.json: config field 'eos_token_id' is \"a\"; expected an integer"));
  for (const char* v : {"1e300", "4294967360", "-2147483649", "64.0", "\"64\""})
    CHECK_THROWS_WITH(parse(std::string(R"("head_dim": )") + v),
                      Catch::StartsWith("m/config.json: config field 'head_dim' is "));
  CHECK_THROWS_WITH(parse(R"("rms_norm_eps": 1e300)"),
                    Catch::StartsWith("m/config.json: config field 'rms_norm_eps' is 1e+300; expected a number"));
  CHECK_THROWS_WITH(config_from_hf_json_text(R"({"model_type": 7})", "m/config.json"),
                    Catch::StartsWith("m/config.json: config field 'model_type' has the wrong type"));
  // Sizes no model has, which made the parameter count overflow int64: refused by validate(), the
  // layer count and head_dim already as they are read (the readers build lists a layer long, and
  // RoPE scaling tables head_dim / 2 long).
  CHECK_THROWS_WITH(config_from_hf_json_text(
                        R"({"model_type": "llama", "hidden_size": 1048576, "intermediate_size": 2147483647, )"
                        R"("num_hidden_layers": 2147483647, "num_attention_heads": 4, "vocab_size": 100})",
                        "m/config.json"),
                    Catch::Contains("config field num_hidden_layers is 2147483647, above the limit"));
  CHECK_THROWS_WITH(config_from_hf_json_text(
                        R"({"model_type": "llama", "hidden_size": 1048576, "intermediate_size": 2147483647, )"
                        R"("num_hidden_layers": 16384, "num_attention_heads": 16, "vocab_size": 100})",
                        "m/config.json"),
                    Catch::Contains("config field intermediate_size is 2147483647, above the limit"));
  CHECK_THROWS_WITH(parse(R"("head_dim": 65536, "num_attention_heads": 128)"),
                    Catch::StartsWith("m/config.json: config field num_attention_heads x head_dim is 8388608"));
  CHECK_THROWS_WITH(parse(R"("rope_scaling": {"rope_type": "llama3", "low_freq_factor": 4, "high_freq_factor": 4})"),
                    Catch::Contains("rope_scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor"));
}

TEST_CASE("fuzz finding 5: a weight_map shard name with a NUL byte or naming a directory is refused",
          "[safetensors][fuzz]") {
  // open(2) stops at the NUL, so "a.safetensors\u0000x" mapped a.safetensors under another name.
  auto index = [](const std::string& shard) {
    return R"({"metadata": {}, "weight_map": {"w": "a.safetensors", "v": )" + shard + "}}";
  };
  REQUIRE(parse_safetensors_index(index(R"("sub/b.safetensors")"), "m/i.json").size() == 2);
  for (const char* shard : {R"("b.safetensors\u0000x")", R"("sub/")", R"(".")", R"("sub/.")"})
    CHECK_THROWS_WITH(parse_safetensors_index(index(shard), "m/i.json"),
                      Catch::StartsWith("m/i.json: weight_map names shard ") && Catch::Contains("not a file name"));
  CHECK_THROWS_WITH(parse_safetensors_index(index(R"("../b.safetensors")"), "m/i.json"),  // standalone: input
                    Catch::Contains("outside the model directory"));
}

namespace {

// Llama 3's and Zephyr's templates as their tokenizer_config.json hold them.
const std::string kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
const std::string kZephyrTemplate =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n"
    "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

}  // namespace

TEST_CASE("fuzz finding 6: trim takes no truncated UTF-8 sequence for a space", "[chat][fuzz]") {
  // "\xe2\x80" followed by any byte up to 0x8a (or by the end) passed for U+2000..U+200A: the '}'
  // after it was trimmed away, and at the end of the content trim's start ran past the end
  // (std::out_of_range from substr).
  const ChatTemplate t = ChatTemplate::parse(kLlama3Template, {"<s>", "</s>"});
  REQUIRE(t.format() == ChatFormat::Llama3);
  const std::string head = "<s><|start_header_id|>user<|end_header_id|>\n\n";
  CHECK(t.render({{"user", "    {{% f2r message in messages %\xe2\x80}"}}, false) ==
        head + "{{% f2r message in messages %\xe2\x80}<|eot_id|>");
  CHECK(t.render({{"user", "\xe2\x80"}}, false) == head + "\xe2\x80<|eot_id|>");
  CHECK(t.render({{"user", "a \xe2\x80"}}, false) == head + "a \xe2\x80<|eot_id|>");
  // Real spaces are still trimmed: U+2000, U+200A, U+3000, NBSP.
  CHECK(t.render({{"user", "\xe2\x80\x80 a\xe2\x80\x8a\xe3\x80\x80\xc2\xa0"}}, false) == head + "a<|eot_id|>");
}

TEST_CASE("fuzz finding 7: a Llama 3.1 tool message that is not UTF-8 is refused, not a JSON exception",
          "[chat][fuzz]") {
  // tojson's string went through nlohmann::json::dump, whose type_error 316 escaped render().
  std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/chat/chat_cases.json");
  REQUIRE(in);
  const nlohmann::json cases = nlohmann::json::parse(in);
  const ChatTemplate t = ChatTemplate::parse(cases["templates"]["llama3.1"]["source"].get<std::string>());
  REQUIRE(t.format() == ChatFormat::Llama31);
  CHECK_THROWS_MATCHES(t.render({{"user", "x"}, {"tool", "ab\xff\xfe"}}), ChatTemplateError,
                       Catch::Message("a tool message's content is not valid UTF-8"));
  CHECK_THAT(t.render({{"user", "x"}, {"tool", "\"a\"\n\xc3\xa9"}}),
             Catch::Contains("<|start_header_id|>ipython<|end_header_id|>\n\n\"\\\"a\\\"\\n\xc3\xa9\"<|eot_id|>"));
}

TEST_CASE("fuzz finding 8: long chat templates are recognized in linear time, without deep recursion",
          "[chat][fuzz]") {
  // Found by running long inputs beside the fuzzer (its inputs stay under ~4 KB): std::regex in the
  // Zephyr check recursed once a space and overflowed the stack on 100,000 spaces before "}}";
  // replace_all and the ChatML default-system search were quadratic (6 s for 1 MB of "{{-").
  const auto start = std::chrono::steady_clock::now();
  const size_t n = 2'000'000;
  std::string zephyr = kZephyrTemplate;
  zephyr.replace(zephyr.find("eos_token }}"), 12, "eos_token" + std::string(n, ' ') + "}}");
  CHECK(ChatTemplate::parse(zephyr).format() == ChatFormat::Zephyr);
  std::string dashes;
  for (size_t i = 0; i < n / 3; ++i) dashes += "{{-";
  CHECK_THROWS_WITH(ChatTemplate::parse(dashes), Catch::StartsWith("chat template: line 1:"));  // not Jinja
  const std::string chatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
      "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  std::string heads;
  for (size_t i = 0; i < n / 26; ++i) heads += "{{'<|im_start|>system\\n'}}";
  // ChatML is now matched whole, so the heads that printed before it make another template.
  CHECK(ChatTemplate::parse(heads + "<|im_end|>" + chatml).format() == ChatFormat::Jinja);
  std::string system = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '";
  for (size_t i = 0; i < n / 26; ++i) system += "<|im_start|>system\\n";
  const ChatTemplate t = ChatTemplate::parse(system + "<|im_end|>\\n' }}{% endif %}" + chatml.substr(29));
  CHECK(t.format() == ChatFormat::ChatML);
  CHECK(t.default_system()->size() == (n / 26 - 1) * 19);  // the first head is the reference's
  // Linear, these take well under a second even with the sanitizers; quadratic, over a minute.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  // The Zephyr check still wants a newline after each turn and the generation prompt.
  std::string joined = kZephyrTemplate;
  joined.replace(joined.find("'<|assistant|>' }}\n"), 19, "'<|assistant|>' }}");
  CHECK(ChatTemplate::parse(joined).format() == ChatFormat::Jinja);
}
