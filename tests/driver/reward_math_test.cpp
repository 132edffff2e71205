// verl v0.5.0's MATH, math_dapo and Search-R1 scorers (driver/reward_math.hpp): hand-picked cases,
// then parity with verl's own Python modules (loaded by file path from $TESSERA_PYTHON's
// site-packages, without importing verl itself) on a few thousand generated cases.
//
// Tessera's character data is utf8proc's (Note [Python strings in UTF-8] in reward_math.cpp), which
// differs from CPython 3.11's in a few places, so the generated cases avoid them and the hand-picked
// ones pin Tessera's side:
//   - str.isdigit: the Numeric_Type=Digit characters that are not Nd (¹²³, ₀-₉, ①⑴⒈❶, ...) are not
//     digits for Tessera ("²,³" keeps its comma);
//   - str.lower: U+0130 İ lowers to "i", not "i\u0307" (utf8proc has no full case mappings);
//   - the final sigma: ª, º and U+1F130..1F189 are not cased for Tessera, so no Σ is generated next
//     to them;
//   - characters new in Unicode 15 (unassigned in Python 3.11): none is generated.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <tuple>
#include <vector>

#include "driver/reward_math.hpp"
#include "tests/driver/driver_test_util.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;

TEST(VerlMath, HandPicked) {
  EXPECT_EQ(math_compute_score("so $\\boxed{\\frac12}$.", "\\frac{1}{2}"), 1.0);
  EXPECT_EQ(math_compute_score("\\boxed{\\dfrac{1}{2}}", "1/2"), 1.0);    // dfrac; a/b -> \frac{a}{b}
  EXPECT_EQ(math_compute_score("\\boxed{0.5}", "\\frac{1}{2}"), 1.0);     // "0.5" is special-cased
  EXPECT_EQ(math_compute_score("\\boxed{.5}", "0.5"), 1.0);               // a leading "." gets a 0
  EXPECT_EQ(math_compute_score("\\boxed{5 \\text{ cm}}", "5"), 1.0);      // units on the right
  EXPECT_EQ(math_compute_score("\\boxed{90^\\circ}", "90"), 1.0);
  EXPECT_EQ(math_compute_score("\\boxed{50\\%}", "50"), 1.0);
  EXPECT_EQ(math_compute_score("\\boxed{2\\sqrt3}", "2\\sqrt{3}"), 1.0);
  EXPECT_EQ(math_compute_score("\\boxed{k = 5}", "5"), 1.0);              // "k = " dropped (<= 2 chars)
  EXPECT_EQ(math_compute_score("\\boxed{abc = 5}", "5"), 0.0);
  EXPECT_EQ(math_compute_score("\\boxed{1} then \\boxed{2}", "2"), 1.0);  // the last box
  EXPECT_EQ(math_compute_score("\\boxed 7$ and more", "7"), 1.0);         // "\boxed " up to '$'
  EXPECT_EQ(math_compute_score("\\fbox{7}", "7"), 0.0);                   // remove_boxed asserts
  EXPECT_EQ(math_compute_score("\\boxed{7", "7"), 0.0);                   // unbalanced
  EXPECT_EQ(math_compute_score("no box 7", "7"), 0.0);
  EXPECT_EQ(math_compute_score("", ""), 0.0);
  // strip_string raises on a trailing \frac; is_equiv then compares the raw strings.
  EXPECT_FALSE(math_strip_string("1\\frac").has_value());
  EXPECT_EQ(math_compute_score("\\boxed{1\\frac}", "1\\frac"), 1.0);
  EXPECT_EQ(math_compute_score("\\boxed{1\\frac}", "1 \\frac"), 0.0);
  EXPECT_EQ(*math_strip_string("\\frac12"), "\\frac{1}{2}");
  EXPECT_EQ(*math_strip_string("\\fracé2"), "\\frac{é}{2}");              // code points, not bytes
  EXPECT_EQ(*math_strip_string("-0/1"), "-0/1");                          // int("-0") prints "0"
  EXPECT_EQ(*math_strip_string("-3/4"), "\\frac{-3}{4}");
  EXPECT_EQ(*math_last_boxed_only_string("a \\boxed{x{y}} b"), "\\boxed{x{y}}");
}

TEST(VerlMathDapo, HandPicked) {
  EXPECT_EQ(math_dapo_compute_score("work\nAnswer: 42", "42"), json({{"score", 1.0}, {"acc", true}, {"pred", "42"}}));
  EXPECT_EQ(math_dapo_compute_score("no answer", "42"),
            json({{"score", -1.0}, {"acc", false}, {"pred", "[INVALID]"}}));
  EXPECT_EQ(math_dapo_compute_score("ANSWER :\n\n1,000 dollars", "1000")["pred"], "1000");
  EXPECT_EQ(math_dapo_compute_score("Answer: 1\nanswer: $\\boxed{2}$", "2")["score"], 1.0);  // the last line
  EXPECT_EQ(math_dapo_compute_score("Anſwer: 3", "3")["acc"], true);                         // IGNORECASE: ſ is s
  EXPECT_EQ(math_dapo_compute_score("Answer: \\frac12", "\\frac{1}{2}")["pred"], "\\frac{1}{2}");
  EXPECT_EQ(math_dapo_compute_score("Answer: 7" + std::string(292, ' '), "7")["pred"], "[INVALID]");  // [-300:]
  EXPECT_EQ(math_dapo_normalize_final_answer("x = \\text{5 cm}"), "5");
  EXPECT_EQ(math_dapo_normalize_final_answer("  ２,３ "), "２３");  // str.isdigit: any Unicode Nd digit
  EXPECT_EQ(math_dapo_normalize_final_answer("٣,٤"), "٣٤");
  EXPECT_EQ(math_dapo_normalize_final_answer("²,³"), "²,³");     // deviation: verl gives "²³"
  // strict_box_verify: the verbatim last box of the final 100 characters; pred None -> null.
  EXPECT_EQ(math_dapo_compute_score("\\boxed{5}", "5", true), json({{"score", 1.0}, {"acc", true}, {"pred", "5"}}));
  EXPECT_EQ(math_dapo_compute_score("\\boxed{5}" + std::string(100, '.'), "5", true),
            json({{"score", -1.0}, {"acc", false}, {"pred", nullptr}}));
  EXPECT_EQ(math_dapo_compute_score("\\boxed{5}" + std::string(100, '.'), "5", true, 100)["acc"], true);
}

TEST(VerlSearchR1, HandPicked) {
  const json paris = {{"target", json::array({"Paris", "City of Light"})}};
  EXPECT_EQ(search_r1_compute_score("<answer> the PARIS! </answer>", paris), 1.0);
  EXPECT_EQ(search_r1_compute_score("<answer>London</answer><answer>city of  light.</answer>", paris), 1.0);
  EXPECT_EQ(search_r1_compute_score("<answer>London</answer>", paris), 0.0);
  EXPECT_EQ(search_r1_compute_score("Paris", paris), 0.0);  // no tags
  std::string many;
  for (int i = 0; i < 11; ++i) many += "<answer>Paris</answer>";
  EXPECT_EQ(search_r1_compute_score(many, paris), 0.25);     // more than 10 tags
  EXPECT_EQ(search_r1_compute_score("<answer>x</answer>", {{"target", "X"}}), 1.0);  // a string target
  EXPECT_EQ(search_r1_compute_score("<answer>x</answer>", {{"target", "y"}}, 0.1), 0.1);
  EXPECT_FALSE(search_r1_compute_score("<answer>x</answer>", json("x")).has_value());    // no "target"
  EXPECT_FALSE(search_r1_compute_score("<answer>x</answer>", {{"target", {1}}}).has_value());
  EXPECT_EQ(search_r1_compute_score("no answer", json("x")), 0.0);  // verl never reads the target
  EXPECT_EQ(search_r1_normalize_answer("The  Ünited\tStates, a nation!"), "ünited states nation");
  EXPECT_EQ(search_r1_normalize_answer("ΟΔΥΣΣΕΥΣ"), "οδυσσευς");    // str.lower's final sigma
  EXPECT_EQ(search_r1_normalize_answer("ΑΣ'Σ ΣΑ'Σ.Α ΑΣ·"), "ασς σασα ας·");  // ' . · are case-ignorable
  EXPECT_EQ(search_r1_normalize_answer("İ"), "i");  // deviation: verl gives "i\u0307"
  EXPECT_EQ(search_r1_normalize_answer("éa the_end"), "éa theend");  // \b is Unicode-aware
  EXPECT_EQ(*search_r1_extract_solution("<answer>\n a \n</answer>"), "a");
}

// ---- Parity with verl's Python modules.

struct Cases {
  std::vector<std::pair<std::string, std::string>> math;  // (solution, ground truth)
  std::vector<std::string> math_strip;
  std::vector<std::tuple<std::string, std::string, bool, std::optional<long long>>> dapo;
  std::vector<std::string> dapo_norm;
  std::vector<std::pair<std::string, json>> search;
  std::vector<std::string> search_text;  // normalize_answer and extract_solution
};

// The first `n` code points of UTF-8 text.
std::string prefix_chars(const std::string& s, size_t n) {
  size_t i = 0;
  for (; i < s.size() && n > 0; --n) {
    ++i;
    while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
  }
  return s.substr(0, i);
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// Whether a Σ meets ª or º (cased for Python, not for Tessera) with at most the case-ignorable
// ' . : between them: where str.lower's final sigma deviates.
bool sigma_meets_ordinal(std::string s) {
  s.erase(std::remove_if(s.begin(), s.end(), [](char ch) { return ch == '\'' || ch == '.' || ch == ':'; }), s.end());
  for (const char* pair : {"Σª", "ªΣ", "Σº", "ºΣ"}) {
    if (s.find(pair) != std::string::npos) return true;
  }
  return false;
}

Cases make_cases() {
  std::mt19937 rng(20250705);
  auto pick = [&](const std::vector<std::string>& v) -> const std::string& { return v[rng() % v.size()]; };
  Cases c;

  // MATH: equivalent spellings sit next to each other (the "partner" of i is i ^ 1).
  const std::vector<std::string> answers = {
      "\\frac12", "\\frac{1}{2}", "1/2", "\\dfrac{1}{2}", "\\tfrac12", "0.5", ".5", "{.5}", " .5", "0 .5",
      "5\\text{ cm}", "5", "5 \\text{ cm}", "5.0", "05", "\\text{ a}\\text{ b}", "90^\\circ", "90", "90^{\\circ}",
      "90^\\circ C", "50\\%", "50", "50%", "\\sqrt3", "\\sqrt{3}", "2\\sqrt 3", "2\\sqrt{3}", "\\sqrt", "\\frac",
      "\\frac1", "\\frac{", "x = 5", "k=5", "abc=5", "x=y=5", "\\left( 1, 2 \\right)", "(1,2)", "\\$5", "5\\!000",
      "5000", "-3/4", "\\frac{-3}{4}", "03/4", "-0/1", "0/1", "1/2/3", "a/b", "1 / 2", "é/2", "\\fracé2",
      "\\frac{é}{2}", "\\sqrté", "\\sqrt{é}", "x=\\frac½3", "½", "1,000", "1000", "a\\\\b", "a\\b",
      "\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}2", "{5}", "\\infty", "∞", "日本", "3.14", "\\pi", "\\{1,2\\}",
      "\n5\n", "", " ", "\\text{(A)}", "(A)", "x \\in [0,1]", "\\boxed{2}", "10^{10}", "\\frac{1}{2} + \\frac{1}{3}",
      "\\frac 12", "\\frac1 2", "é=5", "éé=5", "ééé=5", "12345678901234567890/98765432109876543210",
      repeat("9", 4301) + "/1", repeat("9", 4300) + "/1", "\\frac{1}2", "\\frac1{2}", "\\frac{\\frac12}{3}",
      "\\sqrt\\frac12", "1\\frac", "1 \\frac", "\\text{ m}\\text{ s}", "3\\text{ m}", "3", "\\frac12\\%", "0.50",
      "-.5", "-0.5", "\\!\\!5", "\\tfrac{3}{4}", "3/4", "\\dfrac34", "\\left\\{1\\right\\}", "{1}", "\\$\\$",
      "$x$", "x^2+y^2=1", "y=2x+1", "ℝ", "\\mathbb{R}"};
  const std::vector<std::string (*)(const std::string&)> wrappers = {
      [](const std::string& a) { return "The answer is $\\boxed{" + a + "}$."; },
      [](const std::string& a) { return "\\boxed{" + a + "}"; },
      [](const std::string& a) { return "So \\boxed " + a + "$ done"; },
      [](const std::string& a) { return "\\boxed " + a; },
      [](const std::string& a) { return "\\fbox{" + a + "}"; },
      [](const std::string& a) { return "no box here: " + a; },
      [](const std::string& a) { return "\\boxed{" + a; },
      [](const std::string& a) { return "\\boxed{1} first, then \\boxed{" + a + "}"; },
      [](const std::string& a) { return "\\boxed{" + a + "} and \\fbox{3}"; },
      [](const std::string& a) { return "\\boxed{\\frac{1}{\\boxed{" + a + "}}}"; },
      [](const std::string& a) { return "数学 ∑ \\boxed{" + a + "} ✓"; },
      [](const std::string& a) { return "\\boxed" + a + "{x}"; },
      [](const std::string& a) { return "}{\\boxed{" + a + "}}"; },
  };
  for (size_t i = 0; i < answers.size(); ++i) {
    for (size_t j = 0; j < wrappers.size(); ++j) {
      const std::string& gt = j % 3 == 0 ? answers[i] : j % 3 == 1 ? answers[(i ^ 1) % answers.size()] : pick(answers);
      c.math.emplace_back(wrappers[j](answers[i]), gt);
    }
  }
  c.math_strip = answers;
  for (int k = 0; k < 300; ++k) c.math_strip.push_back(pick(answers) + pick({" ", "", "/", "=", "\\frac", "\\sqrt"}) + pick(answers));

  // math_dapo.
  const std::vector<std::string> dapo_answers = {
      "5", "5.", "$5$", "\\$5", "5 dollars", "five", "1,000", "1000", "1,000,000", "1,0", ",", "1,２", "１２", "12",
      "٣,٤", "½", "\\frac12", "\\frac{1}{2}", "frac12", "\\frac1", "\\sqrt2", "\\sqrt{2}", "\\sqrt", "x = 5",
      "x=y=5", "\\boxed{5}", "$\\boxed{5}$", "\\boxed{\\frac{1}{2}}", "\\text{5 cm}", "5 \\text{cm}", "\\textbf{7}",
      "7", "\\overline{12}", "12", "90^\\circ", "90^{\\circ}", "90", "an apple", "apple", "a 5", "3 units",
      "10 \\text{ m}", "\\mbox{8}", "8", "1 \\text{and} 2", "1,\\text{and} 2", "1,2", "a$b$c$d$e", "$1$ and $2$",
      "  7  ", "7\u3000", "\u00a07", "\x1c" "7\x1f", "\\ldots", "\\dots 4", "{,}", "\"4\"", "\\;5", "Σ", "π",
      "\\pi", "3\\pi/2", "-3", "−3", "(1, 2)", "[INVALID]", "", "\\text{\ns}4", "\\text{a}\\text{b}", "\\text{a}b}",
      "\\boxed{1}+\\boxed{2}", "\\frac{1}{\\sqrt{2}}", "\\fracab", "\\fracabc", "\\sqrtab", "frac{", "\\fracé2",
      "\\sqrt日", "5\\%", "50%", "\\text{m}", "0.5", ".5", "\\dfrac{1}{2}", "\\left(1\\right)", "6 ways",
      "x \\in [0, 1]", "[0,1]", "\\{1, 2\\}", "2^{10}", "1024", "100\\text{ km}", "10 mph", "4 students"};
  const std::string long_prefix = repeat("é∑ words ", 40);
  const std::vector<std::string (*)(const std::string&, const std::string&, const std::string&)> dapo_wrappers = {
      [](const std::string& a, const std::string&, const std::string&) { return "Some work.\nAnswer: " + a; },
      [](const std::string& a, const std::string&, const std::string&) { return "answer:" + a; },
      [](const std::string& a, const std::string&, const std::string&) { return "ANSWER :  " + a + "\nmore text"; },
      [](const std::string& a, const std::string&, const std::string&) { return "Answer:\n\n" + a; },
      [](const std::string& a, const std::string& b, const std::string&) {
        return "The final answer: " + a + "\nAnswer: " + b;
      },
      [](const std::string& a, const std::string& b, const std::string&) { return "Answer: " + a + " Answer: " + b; },
      [](const std::string& a, const std::string&, const std::string&) { return "Anſwer: " + a; },
      [](const std::string& a, const std::string&, const std::string&) { return "AnſweR:\t" + a + "\r\n"; },
      [](const std::string& a, const std::string&, const std::string&) { return "answer: \n\x1c" + a; },
      [](const std::string&, const std::string&, const std::string&) { return std::string("answer: \n"); },
      [](const std::string& a, const std::string&, const std::string&) { return "Final Answer: $" + a + "$"; },
      [](const std::string& a, const std::string&, const std::string&) { return "no answer line " + a; },
      [](const std::string& a, const std::string&, const std::string& p) { return p + "Answer: " + a; },
      [](const std::string& a, const std::string&, const std::string& p) { return "Answer: " + a + "\n" + p; },
      [](const std::string& a, const std::string&, const std::string& p) {
        return "Answer: " + a + prefix_chars(p, 270 + a.size() % 40);
      },
      [](const std::string& a, const std::string&, const std::string&) { return "Answers: " + a + "\nanswer\t:\t" + a; },
      [](const std::string& a, const std::string&, const std::string&) { return "So $\\boxed{" + a + "}$"; },
      [](const std::string& a, const std::string&, const std::string& p) { return "\\boxed{" + a + "}" + prefix_chars(p, 90); },
  };
  const std::vector<std::optional<long long>> pauses = {std::nullopt, 0, 50, 150, 400, -20, std::nullopt, 120};
  for (size_t i = 0; i < dapo_answers.size(); ++i) {
    for (size_t j = 0; j < dapo_wrappers.size(); ++j) {
      const std::string& a = dapo_answers[i];
      std::string gt = j % 3 == 0 ? a : j % 3 == 1 ? dapo_answers[(i ^ 1) % dapo_answers.size()] : pick(dapo_answers);
      if ((i + j) % 17 == 0) gt = "$" + gt + "$\n$" + a + "$";  // a ground truth over two lines
      if ((i + j) % 19 == 0) gt = "\\text{" + gt + "\n}";
      const std::string solution = dapo_wrappers[j](a, pick(dapo_answers), long_prefix);
      c.dapo.emplace_back(solution, gt, false, std::nullopt);
      if ((i * 7 + j) % 4 == 0) c.dapo.emplace_back(solution, (i + j) % 2 ? a : gt, true, pauses[(i + j) % pauses.size()]);
    }
  }
  c.dapo_norm = dapo_answers;
  for (int k = 0; k < 300; ++k) {
    c.dapo_norm.push_back(pick(dapo_answers) + pick({" ", "", "=", "\n", "$", "frac", "sqrt", ","}) + pick(dapo_answers));
  }

  // Search-R1.
  const std::vector<std::string> qa = {
      "Paris", "paris", "The Paris", "the  paris!", "PARIS.", "a Paris", "An apple", "apple", "an apple", "The The",
      "théâtre", "the théâtre", "Θ the", "Σίσυφος", "ΣΊΣΥΦΟΣ", "σίσυφοσ", "ΌΣΟΣ", "όσος", "ΑΣ'Σ", "ας'σ", "ISTANBUL",
      "i̇stanbul", "istanbul", "Straße", "STRASSE", "don't", "dont", "U.S.A.", "usa", "the_end", "the-end", "end",
      "a\tb", "a\u00a0b", "a\u3000b", "a\x1c" "b", "42", "٤٢", "forty two", "", "  ", "ǅ", "ǆ", "Ⅻ", "ⅻ", "Ａ", "ａ",
      "a_b", "ab", "ªa", "the²", "1st", "théa", "a", "the", "an", "A.N.", "the\u2028end", "ΣΑΣ", "σας", "ＴＨＥ",
      "Rock & Roll", "rock roll", "Ωmega", "ωmega", "«the» end", "end", "Ǆemal", "ǆemal"};
  const std::vector<std::string (*)(const std::string&, const std::string&)> qa_wrappers = {
      [](const std::string& a, const std::string&) { return "<answer>" + a + "</answer>"; },
      [](const std::string& a, const std::string& b) { return "<answer> " + b + " </answer><answer>" + a + "</answer>"; },
      [](const std::string& a, const std::string&) { return "think <answer>\n" + a + "\n</answer> trailing"; },
      [](const std::string& a, const std::string&) { return "no tags " + a; },
      [](const std::string& a, const std::string&) { return "<answer>" + a; },
      [](const std::string& a, const std::string&) { return repeat("<answer>" + a + "</answer>", 11); },
      [](const std::string& a, const std::string&) { return repeat("<answer>", 11) + a + "</answer>"; },
      [](const std::string& a, const std::string&) { return "<Answer>" + a + "</Answer>"; },
      [](const std::string& a, const std::string& b) { return "<answer>" + a + "</answer></answer><answer>" + b; },
      [](const std::string& a, const std::string&) { return "<answer>\u3000" + a + "\x1c</answer>"; },
  };
  for (size_t i = 0; i < qa.size(); ++i) {
    for (size_t j = 0; j < qa_wrappers.size(); ++j) {
      json target = json::array();
      if (j % 2 == 0) target.push_back(qa[i]);
      target.push_back(qa[(i ^ 1) % qa.size()]);
      for (size_t k = rng() % 3; k > 0; --k) target.push_back(pick(qa));
      json gt = {{"target", (i + j) % 7 == 0 ? json(pick(qa)) : target}};
      c.search.emplace_back(qa_wrappers[j](qa[i], pick(qa)), gt);
    }
  }
  c.search_text = qa;
  for (const auto& [solution, gt] : c.search) c.search_text.push_back(solution);
  for (int k = 0; k < 300; ++k) {
    std::string text;
    do {
      text = pick(qa);
      text += pick({" ", "", "<answer>", "</answer>", "!", "\u2029", "Σ"});
      text += pick(qa);
    } while (sigma_meets_ordinal(text));
    c.search_text.push_back(text);
  }
  return c;
}

constexpr const char* kParityScript = R"PY(
import importlib.util, json, os, sys

root = importlib.util.find_spec("verl").submodule_search_locations[0]  # finds verl; does not import it

def load(name):
    path = os.path.join(root, "utils", "reward_score", name + ".py")
    spec = importlib.util.spec_from_file_location("tessera_parity_" + name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

m, d, q = load("math"), load("math_dapo"), load("search_r1_like_qa_em")
with open(sys.argv[1], encoding="utf-8") as f:
    cases = json.load(f)
sys.stdout = open(os.devnull, "w")  # verl prints exceptions and random samples

def strip(x):
    try:
        return m.strip_string(x)
    except Exception:
        return None

out = {
    "math": [m.compute_score(s, g) for s, g in cases["math"]],
    "math_strip": [strip(x) for x in cases["math_strip"]],
    "dapo": [d.compute_score(s, g, strict, None if p is None else [0, 0, 0, p]) for s, g, strict, p in cases["dapo"]],
    "dapo_norm": [d.normalize_final_answer(x) for x in cases["dapo_norm"]],
    "search": [float(q.compute_score(s, g)) for s, g in cases["search"]],
    "search_norm": [q.normalize_answer(x) for x in cases["search_text"]],
    "search_extract": [q.extract_solution(x) for x in cases["search_text"]],
}
with open(sys.argv[2], "w", encoding="utf-8") as f:
    json.dump(out, f)
)PY";

json opt(const std::optional<std::string>& s) { return s ? json(*s) : json(nullptr); }

TEST(VerlRewardParity, MatchesVerlPython) {
  const char* py = std::getenv("TESSERA_PYTHON");
  if (py == nullptr || *py == '\0') GTEST_SKIP() << "TESSERA_PYTHON (with verl 0.5.0 installed) is not set";
  const Cases c = make_cases();
  json in = json::object();
  in["math"] = c.math;
  in["math_strip"] = c.math_strip;
  in["dapo"] = json::array();
  for (const auto& [s, g, strict, p] : c.dapo) in["dapo"].push_back({s, g, strict, p ? json(*p) : json(nullptr)});
  in["dapo_norm"] = c.dapo_norm;
  in["search"] = c.search;
  in["search_text"] = c.search_text;

  testing::TempDir dir("reward_math");
  const auto script = dir.write("parity.py", kParityScript);
  const auto cases_path = dir.write("cases.json", in.dump());
  const auto out_path = dir.path() / "out.json", log_path = dir.path() / "log.txt";
  const std::string cmd = fmt::format("'{}' '{}' '{}' '{}' > '{}' 2>&1", py, script.string(), cases_path.string(),
                                      out_path.string(), log_path.string());
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::ifstream log(log_path);
    std::stringstream text;
    text << log.rdbuf();
    FAIL() << "the verl parity script failed (" << rc << "): " << cmd << "\n" << text.str();
  }
  std::ifstream out_file(out_path);
  const json want = json::parse(out_file);

  size_t compared = 0, mismatches = 0;
  auto check = [&](const char* what, size_t i, const json& got, const json& expected, const json& input) {
    ++compared;
    if (got == expected) return;
    if (++mismatches <= 20) {
      ADD_FAILURE() << what << "[" << i << "] input " << input.dump() << "\n  tessera: " << got.dump()
                    << "\n  verl:    " << expected.dump();
    }
  };
  ASSERT_EQ(want["math"].size(), c.math.size());
  for (size_t i = 0; i < c.math.size(); ++i) {
    check("math", i, math_compute_score(c.math[i].first, c.math[i].second), want["math"][i], in["math"][i]);
  }
  for (size_t i = 0; i < c.math_strip.size(); ++i) {
    check("math_strip", i, opt(math_strip_string(c.math_strip[i])), want["math_strip"][i], c.math_strip[i]);
  }
  for (size_t i = 0; i < c.dapo.size(); ++i) {
    const auto& [s, g, strict, p] = c.dapo[i];
    check("dapo", i, math_dapo_compute_score(s, g, strict, p), want["dapo"][i], in["dapo"][i]);
  }
  for (size_t i = 0; i < c.dapo_norm.size(); ++i) {
    check("dapo_norm", i, math_dapo_normalize_final_answer(c.dapo_norm[i]), want["dapo_norm"][i], c.dapo_norm[i]);
  }
  for (size_t i = 0; i < c.search.size(); ++i) {
    const std::optional<double> got = search_r1_compute_score(c.search[i].first, c.search[i].second);
    check("search", i, got ? json(*got) : json(nullptr), want["search"][i], in["search"][i]);
  }
  for (size_t i = 0; i < c.search_text.size(); ++i) {
    check("search_norm", i, search_r1_normalize_answer(c.search_text[i]), want["search_norm"][i], c.search_text[i]);
    check("search_extract", i, opt(search_r1_extract_solution(c.search_text[i])), want["search_extract"][i],
          c.search_text[i]);
  }
  EXPECT_EQ(mismatches, 0u) << "of " << compared << " cases";
  std::cout << "verl parity: " << compared << " cases (math " << c.math.size() << ", math strip_string "
            << c.math_strip.size() << ", math_dapo " << c.dapo.size() << ", normalize_final_answer " << c.dapo_norm.size()
            << ", search_r1 " << c.search.size() << ", normalize_answer + extract_solution " << c.search_text.size()
            << "), " << mismatches << " mismatches\n";
}

}  // namespace
}  // namespace tessera::driver
