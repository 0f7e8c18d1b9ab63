// The Jinja interpreter (include/strata/model/jinja.h) against Jinja2's own renderings
// (tests/fixtures/chat/make_jinja_cases.py: small templates for each feature and realistic chat
// templates), plus what the fixture cannot show: error lines, recursion limits, threads, mentions().
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "strata/model/jinja.h"
#include "test_paths.h"

using namespace strata;
using ojson = nlohmann::ordered_json;

namespace {

ojson jinja_cases() {
  std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/chat/jinja_cases.json");
  REQUIRE(in);
  return ojson::parse(in)["cases"];
}

JinjaGlobals fixed_today(const std::string& today) {
  JinjaGlobals g;
  g.strftime_now = [today](const std::string&) { return today; };
  return g;
}

std::string render(std::string_view source, const ojson& variables = ojson::object()) {
  return JinjaTemplate::parse(source).render(variables);
}

// The message of the JinjaError that parsing or rendering `source` throws ("" if none).
std::string error_of(std::string_view source, const ojson& variables = ojson::object()) {
  try {
    render(source, variables);
  } catch (const JinjaError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("jinja: every fixture case renders as Jinja2 renders it", "[jinja]") {
  const ojson cases = jinja_cases();
  REQUIRE(cases.size() > 300);
  size_t texts = 0, raised = 0, errors = 0;
  for (const ojson& c : cases) {
    const std::string name = c["name"].get<std::string>();
    const std::string source = c["template"].get<std::string>();
    INFO("case: " << name);
    INFO("template: " << source);
    const JinjaGlobals globals = fixed_today(c.value("today", std::string("26 Jul 2024")));
    if (c.contains("text")) {
      ++texts;
      std::string got;
      REQUIRE_NOTHROW(got = JinjaTemplate::parse(source).render(c["variables"], globals));
      CHECK(got == c["text"].get<std::string>());
    } else if (c["error"].is_string()) {
      ++raised;
      try {
        JinjaTemplate::parse(source).render(c["variables"], globals);
        FAIL("no exception; expected raise_exception(" << c["error"] << ")");
      } catch (const JinjaRaised& e) {
        CHECK(std::string(e.what()) == c["error"].get<std::string>());
      }
    } else {
      ++errors;
      CHECK_THROWS_AS(JinjaTemplate::parse(source).render(c["variables"], globals), JinjaError);
    }
  }
  CHECK(texts > 250);
  CHECK(raised > 3);
  CHECK(errors > 20);
}

TEST_CASE("jinja: syntax errors name their line", "[jinja]") {
  CHECK_THAT(error_of("line one\n{% if x %}\nno end\n"), Catch::Matchers::StartsWith("line 3:"));
  CHECK_THAT(error_of("a\nb\n{{ 1 + }}"), Catch::Matchers::StartsWith("line 3:"));
  CHECK_THAT(error_of("\n\n\n{% frobnicate %}"), Catch::Matchers::StartsWith("line 4:") &&
                                                     Catch::Matchers::Contains("frobnicate"));
  CHECK_THAT(error_of("{% for x in y %}\n{% endif %}"), Catch::Matchers::StartsWith("line 2:"));
  CHECK_THAT(error_of("{{ 'unterminated }}"), Catch::Matchers::StartsWith("line 1:"));
  CHECK_THAT(error_of("{# never closed"), Catch::Matchers::StartsWith("line 1:"));
  CHECK_THAT(error_of("x\n{{ y|nosuchfilter }}"), Catch::Matchers::StartsWith("line 2:") &&
                                                      Catch::Matchers::Contains("nosuchfilter"));
  // A render error names the line of the failing expression.
  CHECK_THAT(error_of("ok\n{{ missing.attr }}"), Catch::Matchers::StartsWith("line 2:") &&
                                                     Catch::Matchers::Contains("'missing' is undefined"));
  CHECK_THAT(error_of("{% set d = {} %}\n\n{{ d.a.b }}"),
             Catch::Matchers::StartsWith("line 3:") && Catch::Matchers::Contains("has no attribute 'a'"));
  // raise_exception's message comes exactly as given, no line.
  try {
    render("\n{{ raise_exception('Bad: ' ~ 1) }}");
    FAIL("no exception");
  } catch (const JinjaRaised& e) {
    CHECK(std::string(e.what()) == "Bad: 1");
  }
}

TEST_CASE("jinja: runaway templates fail instead of crashing or hanging", "[jinja]") {
  // Unbounded macro recursion.
  CHECK_THAT(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
             Catch::Matchers::Contains("recursion too deep"));
  // Deeply nested source.
  CHECK_THROWS_AS(JinjaTemplate::parse("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"),
                  JinjaError);
  // Refused as soon as the brackets pass the parser's bound, not after lexing the rest.
  CHECK_THROWS_WITH(JinjaTemplate::parse("{{ " + std::string(100000, '[')),
                    Catch::Matchers::Contains("line 1: template nested too deeply"));
  CHECK_THROWS_AS(JinjaTemplate::parse("{{ " + std::string(100000, '-') + "1 }}"), JinjaError);
  std::string nested_ifs;
  for (int k = 0; k < 1000; ++k) nested_ifs += "{% if true %}";
  CHECK_THROWS_AS(JinjaTemplate::parse(nested_ifs), JinjaError);
  // Exponential growth through a namespace, a list nested in itself, an endless range.
  CHECK_THROWS_AS(render("{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
                         "{% endfor %}{{ ns.s|length }}"),
                  JinjaError);
  CHECK_THROWS_AS(render("{% set ns = namespace(x=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}{% endfor %}"),
                  JinjaError);
  CHECK_THROWS_AS(render("{{ 'x' * 10000000000 }}"), JinjaError);
  // A namespace that holds itself prints (to the nesting limit) or fails, and does not leak.
  CHECK_THROWS_AS(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"), JinjaError);
  // A macro escaping the loop iteration it was defined in.
  CHECK_NOTHROW(render("{% set ns = namespace() %}{% for i in [1] %}{% macro m() %}x{% endmacro %}"
                       "{% set ns.m = m %}{% endfor %}{{ ns.m is defined }}"));
}

// [slow]: it runs the step budget out (2 s here, a minute under AddressSanitizer, whose stage skips it).
TEST_CASE("jinja: a render that would run for hours fails at its step budget", "[jinja][slow]") {
  CHECK_THROWS_AS(render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
                  JinjaError);
}

TEST_CASE("jinja: one template renders on several threads at once", "[jinja]") {
  const ojson cases = jinja_cases();
  const ojson* qwen = nullptr;
  for (const ojson& c : cases)
    if (c["name"] == "qwen3-style tools gen=True +tools") qwen = &c;
  REQUIRE(qwen != nullptr);
  const JinjaTemplate t = JinjaTemplate::parse((*qwen)["template"].get<std::string>());
  const std::string expected = (*qwen)["text"].get<std::string>();
  std::vector<std::string> results(4);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < results.size(); ++k)
    threads.emplace_back([&, k] {
      for (int round = 0; round < 50; ++round) {
        std::string got = t.render((*qwen)["variables"]);
        if (got != expected) {
          results[k] = "mismatch";
          return;
        }
        results[k] = std::move(got);
      }
    });
  for (std::thread& th : threads) th.join();
  for (const std::string& r : results) CHECK(r == expected);
}

TEST_CASE("jinja: mentions() names the variables a template reads", "[jinja]") {
  const JinjaTemplate t = JinjaTemplate::parse(
      "{% if tools %}{{ tools|tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
      "{{ 'enable_thinking' }}{{ x.reasoning }}{% set y = 1 %}");
  CHECK(t.mentions("tools"));
  CHECK(t.mentions("messages"));
  CHECK(t.mentions("x"));
  CHECK_FALSE(t.mentions("enable_thinking"));  // only in a string literal
  CHECK_FALSE(t.mentions("reasoning"));        // an attribute, not a variable
  CHECK_FALSE(t.mentions("content"));
  CHECK_FALSE(t.mentions("add_generation_prompt"));
}

TEST_CASE("jinja: values come from JSON as Python's", "[jinja]") {
  const ojson vars = ojson::parse(R"({"i": 3, "big": 9223372036854775807, "f": 2.0, "e": 1e-7, "s": "\u00e9",
                                      "o": {"z": 1, "a": [true, null]}})");
  CHECK(render("{{ i }} {{ big }} {{ f }} {{ e }} {{ s }} {{ o }}", vars) ==
        "3 9223372036854775807 2.0 1e-07 \u00e9 {'z': 1, 'a': [True, None]}");
  CHECK(render("{{ o|tojson }}", vars) == R"({"z": 1, "a": [true, null]})");
  CHECK_THROWS_AS(render("{{ big + 1 }}", vars), JinjaError);  // 64-bit integers
  // JSON's unsigned integers past int64 print exactly; arithmetic on them fails.
  const ojson u = ojson::parse(R"({"n": 18446744073709551615})");
  CHECK(render("{{ n }} {{ n|tojson }} {{ n > 1 }}", u) == "18446744073709551615 18446744073709551615 True");
  CHECK_THROWS_AS(render("{{ n - 1 }}", u), JinjaError);
  CHECK_THROWS_AS(JinjaTemplate::parse("x").render(ojson::array()), JinjaError);
  // Default strftime_now: the local time, formatted.
  CHECK(render("{{ strftime_now('%Y')|length }}") == "4");
}
