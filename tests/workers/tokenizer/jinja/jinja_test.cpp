// jinja_test.cpp: the Jinja interpreter. (a) Language pieces against outputs jinja2 3.1.6 gives
// (each literal below was checked with Python); (b) parity with transformers itself: a Python
// script run with $TESSERA_PYTHON renders the same snippets and real chat templates (Qwen3,
// Qwen2.5, Llama 3.1/3.2, Mistral v0.3, Gemma 2, DeepSeek-R1 distill) over many conversations
// with transformers' own compiled environment, and every output must match byte for byte.
#include <gtest/gtest.h>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "workers/tokenizer/jinja/jinja.hpp"

namespace tessera::jinja {
namespace {

using ojson = nlohmann::ordered_json;

// Renders `tmpl` with the JSON object `ctx`; an error comes back as "ERROR: <message>".
std::string render(std::string_view tmpl, std::string_view ctx = "{}") {
  auto t = Template::parse(tmpl, "t.jinja");
  if (!t.ok()) return "ERROR: " + t.status().message();
  auto out = t->render(ojson::parse(ctx));
  if (!out.ok()) return "ERROR: " + out.status().message();
  return *out;
}

// --- (a) language pieces ---------------------------------------------------------------------

TEST(JinjaText, PlainTextOutputAndComments) {
  EXPECT_EQ(render("plain text"), "plain text");
  EXPECT_EQ(render("a{{ x }}b", R"({"x": "X"})"), "aXb");
  EXPECT_EQ(render("a{# gone #}b"), "ab");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
  EXPECT_EQ(render("x\n"), "x");          // keep_trailing_newline=False drops one newline
  EXPECT_EQ(render("x\n\n"), "x\n");
  EXPECT_EQ(render("a\r\nb\rc"), "a\nb\nc");  // newlines normalised
}

TEST(JinjaText, TrimBlocksAndLstripBlocks) {
  EXPECT_EQ(render("{% if true %}\nx\n{% endif %}\ny"), "x\ny");
  EXPECT_EQ(render("a\n    {% if true %}\n    b\n    {% endif %}\nc"), "a\n    b\nc");
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\n  c\n"), "a\n  b\n  c");
  EXPECT_EQ(render("  {{ 'x' }}\n{% if true %}  y{% endif %}"), "  x\n  y");  // no lstrip for {{
  EXPECT_EQ(render("a  {#- c #}  b {# c -#}  d"), "a  b d");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");  // + keeps the indentation
  EXPECT_EQ(render("{% if true +%}\nx{% endif %}"), "\nx");  // +%} keeps the newline
}

TEST(JinjaText, MinusStripsWhitespace) {
  EXPECT_EQ(render("a   {{- 'b' -}}   c  {%- if true -%}  d  {%- endif %}"), "abcd");
  EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}\n"), "a\nb");
  EXPECT_EQ(render("x \n\t {%- if true %}y{% endif %}"), "xy");
}

TEST(JinjaLiterals, NumbersStringsAndContainers) {
  EXPECT_EQ(render("{{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 10 / 4 }} {{ 1.5 + 1 }}"),
            "3 3 -4 2 1024 2.5 2.5");
  EXPECT_EQ(render("{{ 1.0 }} {{ 1e16 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 1/3 }} {{ 2.0**60 }} {{ -0.0 }} {{ 1_000 }}"),
            "1.0 1e+16 1e-05 0.30000000000000004 0.3333333333333333 1.152921504606847e+18 -0.0 1000");
  EXPECT_EQ(render(R"({{ 'a\nb\t"c"' }}|{{ "it's" }}|{{ 'a\u00e9\x41' }}|{{ "\d" }}|{{ 'x' "y" }})"),
            "a\nb\t\"c\"|it's|a\xc3\xa9" "A|\\d|xy");
  EXPECT_EQ(render("{{ none }} {{ true }} {{ False }} {{ None }}"), "None True False None");
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}] }}"), "[1, 'a', None, True, 1.5, {'k': \"it's\"}]");
  EXPECT_EQ(render("{{ (1, 2) }}{{ (1,) }}{{ () }}{{ {} }}{{ [] }}"), "(1, 2)(1,)(){}[]");
  EXPECT_EQ(render("{{ ['a\\nb', 'é'] }}"), "['a\\nb', '\xc3\xa9']");
}

TEST(JinjaExpressions, OperatorsAndPrecedence) {
  EXPECT_EQ(render("{{ 1 < 2 }}{{ 2 <= 1 }}{{ 'a' == 'a' }}{{ 'a' != 'a' }}{{ 3 > 2 >= 2 }}{{ 1 == 1.0 }}"),
            "TrueFalseTrueFalseTrueTrue");
  EXPECT_EQ(render("{{ true and false }}{{ true or false }}{{ not true }}{{ not 1 == 2 }}{{ 0 or 'x' }}{{ 'y' and 0 }}"),
            "FalseTrueFalseTruex0");
  EXPECT_EQ(render("{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in d }}{{ 'q' not in d }}", R"({"d": {"k": 1}})"),
            "TrueTrueTrueTrue");
  EXPECT_EQ(render("{{ 'n=' ~ 3 ~ none ~ true ~ missing }}"), "n=3NoneTrue");
  EXPECT_EQ(render("{{ 'a' + ' b ' | trim + 'c' }}"), "abc");  // a filter binds tighter than +
  EXPECT_EQ(render("{{ -2 ** 2 }} {{ 2 * 3 - 1 }} {{ (1 + 2) * 3 }} {{ 'ab' * 2 }} {{ [0] * 2 }}"), "4 5 9 abab [0, 0]");
  EXPECT_EQ(render("{{ 'yes' if flag else 'no' }}[{{ 'a' if false }}]{{ 1 if true else 2 if false }}",
                   R"({"flag": true})"),
            "yes[]1");
  EXPECT_EQ(render("{{ '%s-%d' % ('a', 3) }}"), "a-3");
}

TEST(JinjaExpressions, AttributeItemAndSlice) {
  const char* ctx = R"({"xs": [1, 2, 3, 4, 5], "d": {"k": "v", "items": 3}, "s": "héllo"})";
  EXPECT_EQ(render("{{ xs[0] }}{{ xs[-1] }}{{ xs[1:] }}{{ xs[:2] }}{{ d['k'] }}{{ d.k }}{{ d['items'] }}", ctx),
            "15[2, 3, 4, 5][1, 2]vv3");
  EXPECT_EQ(render("{{ xs[::-1] }}{{ xs[::2] }}{{ xs[-1:0:-1] }}{{ xs[:-2:-1] }}{{ xs[10:] }}", ctx),
            "[5, 4, 3, 2, 1][1, 3, 5][5, 4, 3, 2][5][]");
  EXPECT_EQ(render("{{ s[1] }}{{ s[::-1] }}{{ s[-3:] }}{{ s|length }}", ctx), "\xc3\xa9oll\xc3\xa9hllo5");
  EXPECT_EQ(render("[{{ xs[9] }}][{{ d.nope }}][{{ xs.nope }}]", ctx), "[][][]");
  EXPECT_EQ(render("{{ xs.0 }}", ctx), "1");
}

TEST(JinjaStatements, IfForSet) {
  EXPECT_EQ(render("{% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %},{% endfor %}"),
            "one,two,many,");
  EXPECT_EQ(render("{% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
                   "{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}",
                   R"({"items": ["a", "b"]})"),
            "10TrueFalse221;21FalseTrue210;");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  // `else` also runs when no iteration reached the end of the body (jinja2's generated code).
  EXPECT_EQ(render("{% for x in [1, 2] %}{% break %}{% else %}E{% endfor %}"), "E");
  EXPECT_EQ(render("{% for x in [1, 2] %}{% if x == 2 %}{% break %}{% endif %}{% else %}E{% endfor %}"), "");
  EXPECT_EQ(render("{% for x in [1, 2, 3] if x > 1 %}{{ loop.index }}/{{ loop.length }} {% endfor %}"), "1/2 2/2 ");
  EXPECT_EQ(render("{% for n in [1, 2, 3, 4] %}{% if n == 2 %}{% continue %}{% endif %}{% if n == 4 %}{% break %}{% endif %}"
                   "{{ n }}{% endfor %}"),
            "13");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", R"({"d": {"z": 1, "a": "b"}})"), "z=1;a=b;");
  EXPECT_EQ(render("{% for x in 'ab' %}{{ loop.previtem }}{{ x }}{{ loop.nextitem }}|{% endfor %}"), "ab|ab|");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{% endfor %}"), "aba");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}"), "12");
  EXPECT_EQ(render("{% set x %}a{{ 1 }}b{% endset %}[{{ x }}]{% set y | upper %}q{% endset %}{{ y }}"), "[a1b]Q");
  EXPECT_EQ(render("{% filter upper %}abc{% endfilter %}"), "ABC");
  EXPECT_EQ(render("{% with a = 1 %}{{ a }}{% endwith %}[{{ a }}]"), "1[]");
  EXPECT_EQ(render("{% generation %}g{% endgeneration %}"), "g");
}

TEST(JinjaStatements, ScopesFollowJinja) {
  // A for-loop iteration is a fresh frame; if-blocks are not frames.
  EXPECT_EQ(render("{% set a = 0 %}{% for x in [1, 2, 3] %}{{ a }}{% set a = a + 1 %}{{ a }};{% endfor %}{{ a }}"),
            "01;01;01;0");
  EXPECT_EQ(render("{% set a = 0 %}{% for x in [1, 2, 3] %}{% if x == 2 %}{% set a = 5 %}{% endif %}{{ a }};{% endfor %}"),
            "0;5;0;");
  EXPECT_EQ(render("{% if true %}{% set b = 3 %}{% endif %}{{ b }}"), "3");
  EXPECT_EQ(render("{% for x in [1, 2] %}{% set b = x %}{% endfor %}[{{ b }}]"), "[]");
  EXPECT_EQ(render("{% set ns = namespace(total=0, seen=false) %}{% for x in [1, 2, 3] %}{% set ns.total = ns.total + x %}"
                   "{% endfor %}{{ ns.total }}{{ ns.seen }}"),
            "6False");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.a = 'x' %}{{ ns.a }}"), "x");
}

TEST(JinjaStatements, Macros) {
  EXPECT_EQ(render("{% macro m(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{% endmacro %}{{ m(1) }}{{ m(1, 3, 4) }}{{ m(b=5, a=0) }}"),
            "12()13(4,)05()");
  EXPECT_EQ(render("{% macro m(a) %}{{ a }}{{ caller() }}{% endmacro %}{% call m(1) %}inner{% endcall %}"), "1inner");
  EXPECT_EQ(render("{% macro m() %}{{ x }}{% endmacro %}{% set x = 1 %}{{ m() }}"), "1");
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}"), "321");
  EXPECT_EQ(render("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}"),
            "ERROR: t.jinja:1: macro 'm' takes not more than 1 argument(s)");
}

TEST(JinjaFilters, Common) {
  const char* ctx = R"({"xs": [3, 1, 2], "ms": [{"role": "user", "n": 1}, {"role": "assistant", "n": 2}, {"role": "user", "n": 3}]})";
  EXPECT_EQ(render("{{ '  x  ' | trim }}|{{ 'xxay' | trim('xy') }}|{{ none | trim }}|{{ xs | length }}|{{ 'Ab' | upper }}"
                   "{{ 'Ab' | lower }}|{{ xs | join('-') }}|{{ xs | first }}{{ xs | last }}|{{ missing | default('d') }}"
                   "{{ '' | d('e', true) }}|{{ 5 | string }}",
                   ctx),
            "x|a|None|3|ABab|3-1-2|32|de|5");
  EXPECT_EQ(render("{{ xs | sort }}{{ xs | sort(reverse=true) }}{{ xs | reverse | list }}{{ [1, 1, 'a', 'A'] | unique | list }}"
                   "{{ xs | max }}{{ xs | min }}{{ xs | sum }}",
                   ctx),
            "[1, 2, 3][3, 2, 1][2, 1, 3][1, 'a']316");
  EXPECT_EQ(render("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='n') | list }}"
                   "{{ ms | rejectattr('role', 'equalto', 'user') | list | length }}{{ xs | select('odd') | list }}"
                   "{{ xs | reject('odd') | list }}{{ ['a', 'b'] | map('upper') | join }}",
                   ctx),
            "[1, 3]1[3, 1][2]AB");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2} | dictsort }}{{ {'b': 1} | items | list }}{{ 'hello world-foo' | title }}"
                   "{{ 'hELLO' | capitalize }}{{ 'aXbX' | replace('X', '-') }}"),
            "[('a', 2), ('b', 1)][('b', 1)]Hello World-FooHelloa-b-");
  EXPECT_EQ(render("{{ 1.5|round }}{{ 2.5|round }}{{ 3|round }}{{ 2.567|round(2) }}{{ '3.7'|int }}{{ '3'|float }}{{ 'x'|int }}"
                   "{{ -3|abs }}"),
            "2.02.032.5733.003");
  EXPECT_EQ(render("{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}"), "a\n  b\n\n  c|  a\n  b");
  EXPECT_EQ(render("{{ '<a>' | e }}{{ '<a>' | safe }}{{ 'a b  c' | wordcount }}"), "&lt;a&gt;<a>3");
}

TEST(JinjaFilters, ToJsonIsPythonsJsonDumps) {
  const char* ctx = R"({"x": {"b": [1, 2.5, null, true, "é\n\"\u0001"], "a": {}, "c": []}})";
  EXPECT_EQ(render("{{ x | tojson }}", ctx), "{\"b\": [1, 2.5, null, true, \"\xc3\xa9\\n\\\"\\u0001\"], \"a\": {}, \"c\": []}");
  EXPECT_EQ(render("{{ {'a': [1, {'z': 1}], 'b': {}} | tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1,\n    {\n      \"z\": 1\n    }\n  ],\n  \"b\": {}\n}");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [1, 2]} | tojson(sort_keys=true, separators=(',', ':')) }}"), "{\"a\":[1,2],\"b\":1}");
  EXPECT_EQ(render("{{ 'é' | tojson(ensure_ascii=true) }}{{ 1.0 | tojson }}"), "\"\\u00e9\"1.0");
  EXPECT_EQ(render("{{ missing | tojson }}"), "ERROR: t.jinja:1: Object of type Undefined is not JSON serializable");
}

TEST(JinjaFilters, GroupbyAndWordwrap) {
  const char* ctx = R"({"ms": [{"role": "user", "n": 1}, {"role": "assistant", "n": 2}, {"role": "User", "n": 3}]})";
  // groupby sorts and groups case-insensitively unless told otherwise; a group's grouper is then
  // its first item's value. Groups are (grouper, list) namedtuples that print as tuples.
  EXPECT_EQ(render("{% for role, items in ms | groupby('role') %}{{ role }}={{ items | map(attribute='n') | join(',') }};"
                   "{% endfor %}",
                   ctx),
            "assistant=2;user=1,3;");
  EXPECT_EQ(render("{% for g in ms | groupby('role', case_sensitive=true) %}{{ g.grouper }}:{{ g.list | length }};{% endfor %}",
                   ctx),
            "User:1;assistant:1;user:1;");
  EXPECT_EQ(render("{{ ms | groupby('tool', default='none') | map(attribute='grouper') | list }}"
                   "{{ [[1, 'x'], [2, 'y'], [1, 'z']] | groupby(0) }}",
                   ctx),
            "['none'][(1, [[1, 'x'], [1, 'z']]), (2, [[2, 'y']])]");
  // wordwrap is textwrap.wrap per line: hyphenated words break after a hyphen, long words are cut.
  EXPECT_EQ(render("{{ 'The quick brown fox jumps over the lazy dog' | wordwrap(12) }}"),
            "The quick\nbrown fox\njumps over\nthe lazy dog");
  EXPECT_EQ(render("{{ 'well-known state-of-the-art\nsupercalifragilistic' | wordwrap(9, wrapstring='|') }}"),
            "well-|known|state-of-|the-art|supercali|fragilist|ic");
  EXPECT_EQ(render("{{ 'a-very-long-word here' | wordwrap(5, break_long_words=false, break_on_hyphens=false) }}"),
            "a-very-long-word\nhere");
  EXPECT_EQ(render("{{ 'a b' | wordwrap(0) }}"), "ERROR: t.jinja:1: invalid width 0 (must be > 0)");
}

TEST(JinjaTests, IsTests) {
  EXPECT_EQ(render("{{ x is defined }}{{ y is defined }}{{ y is not defined }}{{ n is none }}{{ s is string }}"
                   "{{ d is mapping }}{{ s is iterable }}{{ 3 is number }}{{ true is number }}{{ true is integer }}"
                   "{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 'a' is in 'abc' }}{{ 2 is equalto 2 }}{{ x is sameas 1 }}",
                   R"({"x": 1, "n": null, "s": "s", "d": {}})"),
            "TrueFalseTrueTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ strftime_now is defined }}{{ raise_exception is defined }}{{ range is defined }}{{ nothing is defined }}"),
            "TrueTrueTrueFalse");
}

TEST(JinjaMethods, StrDictList) {
  EXPECT_EQ(render("{{ ' x '.strip() }}{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'ab'.upper() }}"
                   "{{ \"they're\".title() }}|{{ ' x '.lstrip() }}|{{ ' x '.rstrip() }}|"),
            "xTrueTrueABThey'Re|x | x|");
  EXPECT_EQ(render(R"([{{ '\n\nx\n'.strip('\n') }}][{{ 'xxay'.lstrip('x') }}][{{ 'ayyx'.rstrip('xy') }}][{{ ' a '.strip(none) }}])"),
            "[x][ay][a][a]");
  EXPECT_EQ(render("{{ 'a<b>c<b>'.split('<b>') }}{{ ' a  b '.split() }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}"
                   "{{ 'r</think>a'.split('</think>')[-1] }}"),
            "['a', 'c', '']['a', 'b']['a', 'b,c']['a,b', 'c']a");
  EXPECT_EQ(render("{{ d.get('k') }}{{ d.get('q', 'dflt') }}{{ d.get('q') }}{{ d.keys() | list }}{{ d.values() | list }}",
                   R"({"d": {"k": "v"}})"),
            "vdfltNone['k']['v']");
  EXPECT_EQ(render("{{ 'a-b'.replace('-', '+') }}{{ 'abcb'.find('b') }}{{ 'abcb'.rfind('b') }}{{ 'abcb'.count('b') }}"
                   "{{ ', '.join(['x', 'y']) }}{{ '{} {}'.format(1, 'x') }}{{ [1, 2, 1].count(1) }}{{ [1, 2].index(2) }}"),
            "a+b132x, y1 x21");
}

TEST(JinjaGlobals, RangeDictNamespaceRaise) {
  EXPECT_EQ(render("{% for i in range(3) %}{{ i }}{% endfor %}{{ range(1, 8, 3) | list }}{{ range(3, -1, -1) | list }}"),
            "012[1, 4, 7][3, 2, 1, 0]");
  EXPECT_EQ(render("{{ dict(a=1, b='x') }}{{ namespace(a=1) }}"), "{'a': 1, 'b': 'x'}<Namespace {'a': 1}>");
  EXPECT_EQ(render("line1\n{{ raise_exception('Conversation roles must alternate') }}"),
            "ERROR: t.jinja:2: Conversation roles must alternate");
  const std::string today = render("{{ strftime_now('%Y') }}");
  EXPECT_EQ(today.size(), 4u) << today;
}

TEST(JinjaUndefined, BehavesLikeJinjaDefaultUndefined) {
  EXPECT_EQ(render("[{{ missing }}][{{ missing | length }}][{{ missing | list }}][{% for x in missing %}x{% endfor %}]"
                   "[{{ missing is iterable }}][{{ missing == missing }}]"),
            "[][0][[]][][True][True]");
  EXPECT_EQ(render("{{ x.y }}"), "ERROR: t.jinja:1: 'x' is undefined");
  EXPECT_EQ(render("{{ xs[5].a }}", R"({"xs": [1]})"), "ERROR: t.jinja:1: list object has no element 5");
  EXPECT_EQ(render("{{ d.a.b }}", R"({"d": {}})"), "ERROR: t.jinja:1: 'dict object' has no attribute 'a'");
  EXPECT_EQ(render("{{ 'abc' + 1 }}"), "ERROR: t.jinja:1: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(render("{{ [1, 2].append(3) }}"), "ERROR: t.jinja:1: access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns._x = 1 %}"),
            "ERROR: t.jinja:1: Chat templates cannot store underscore-prefixed attributes on a namespace, but got '_x'. "
            "Please rename the attribute.");
}

TEST(JinjaErrors, SyntaxErrorsNameTheLine) {
  EXPECT_EQ(render("a\n{% if x %}b"),
            "ERROR: t.jinja:2: Unexpected end of template. Jinja was looking for the following tags: 'elif' or 'else' or "
            "'endif'. The innermost block that needs to be closed is 'if'.");
  EXPECT_EQ(render("{{ x | nosuch }}"), "ERROR: t.jinja:1: No filter named 'nosuch'.");
  EXPECT_EQ(render("{% if false %}{{ x | nosuch }}{% endif %}ok"), "ok");  // deferred inside an if, as in jinja2
  EXPECT_EQ(render("\n\n{% foo %}"), "ERROR: t.jinja:3: Encountered unknown tag 'foo'.");
  EXPECT_EQ(render("{% break %}"), "ERROR: t.jinja:1: 'break' outside loop");
  EXPECT_EQ(render("{{ 'abc }}"), "ERROR: t.jinja:1: unexpected char \"'\" at 3");
  EXPECT_EQ(render("{{ (1 }}"), "ERROR: t.jinja:1: unexpected '}', expected ')'");
  auto t = Template::parse("{{ 1 }}", "x.jinja");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->source_name(), "x.jinja");
  EXPECT_FALSE(t->render(ojson::array()).ok());
  EXPECT_EQ(t->render(ojson::array()).status().code(), ErrorCode::invalid_argument);
}

// transformers renders with no template loader, so jinja2 raises TypeError("no loader for this
// environment specified") when one of these tags runs; Tessera refuses them when parsing, naming
// the tag and its line.
TEST(JinjaErrors, LoadingTagsFailNamingTheTagAndLine) {
  EXPECT_EQ(render("a\n{% include 'other.jinja' %}"),
            "ERROR: t.jinja:2: the 'include' tag is not supported (templates are rendered standalone)");
  EXPECT_EQ(render("{% extends 'base.jinja' %}"),
            "ERROR: t.jinja:1: the 'extends' tag is not supported (templates are rendered standalone)");
  EXPECT_EQ(render("\n\n{% import 'macros.jinja' as m %}"),
            "ERROR: t.jinja:3: the 'import' tag is not supported (templates are rendered standalone)");
  EXPECT_EQ(render("{% if x %}\n{%- from 'macros.jinja' import m -%}\n{% endif %}"),
            "ERROR: t.jinja:2: the 'from' tag is not supported (templates are rendered standalone)");
}

TEST(JinjaApi, JsonContextsAndThreads) {
  auto t = Template::parse("{{ d | tojson }}{% for k in d %}{{ k }}{% endfor %}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->render(ojson::parse(R"({"d": {"b": 1, "a": 2}})")), "{\"b\": 1, \"a\": 2}ba");  // caller's order
  EXPECT_EQ(*t->render(nlohmann::json::parse(R"({"d": {"b": 1, "a": 2}})")), "{\"a\": 2, \"b\": 1}ab");  // sorted
  const Template copy = *t;
  EXPECT_EQ(*copy.render(ojson::parse(R"({"d": {}})")), "{}");
  // One parsed template, rendered from several threads at once.
  auto macro = Template::parse("{% macro m(x) %}<{{ x }}>{% endmacro %}{% set ns = namespace(n=0) %}"
                               "{% for i in range(k) %}{% set ns.n = ns.n + i %}{{ m(i) }}{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(macro.ok());
  std::vector<std::thread> threads;
  std::vector<std::string> outs(4);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 50; ++rep) outs[k] = *macro->render(ojson{{"k", k + 1}});
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(outs[0], "<0>0");
  EXPECT_EQ(outs[3], "<0><1><2><3>6");
}

TEST(JinjaValues, GeneratorsViewsAndMarkupFollowPython) {
  // Filters like select/map return one-shot generators: always truthy, consumed by one loop.
  EXPECT_EQ(render("{% set g = [1, 2, 3] | select('odd') %}{% if [] | select %}T{% endif %}{{ g | list }}{{ g | list }}"),
            "T[1, 3][]");
  EXPECT_EQ(render("{{ [1] | select | length }}"), "ERROR: t.jinja:1: object of type 'generator' has no len()");
  EXPECT_EQ(render("{{ d.items() }}{{ d.keys() }}{{ range(3) }}{{ range(5)[1:] }}", R"({"d": {"a": 1}})"),
            "dict_items([('a', 1)])dict_keys(['a'])range(0, 3)range(1, 5)");
  // Markup (from |safe) escapes what is added to it.
  EXPECT_EQ(render("{{ ('<b>' | safe) + '<i>' }}|{{ ('<b>' | safe) ~ '<i>' }}|{{ ('a<' | safe).replace('<', '>') }}"),
            "<b>&lt;i&gt;|<b><i>|a&gt;");
}

// --- (b) parity with transformers ----------------------------------------------------------

// Small templates that exercise one language piece each; rendered by both implementations.
const std::vector<std::tuple<std::string, std::string, std::string>>& snippets() {
  static const std::vector<std::tuple<std::string, std::string, std::string>> k = {
      {"text", "plain {{ 'text' }}\n", "{}"},
      {"trim_lstrip", "a\n  {% if true %}\n  b\n  {% endif %}\n  c\n  {# c #}\n  d", "{}"},
      {"minus", "a \n {{- 'b' -}} \n c {%- if true -%} d {%- endif -%} \n", "{}"},
      {"plus", "  {%+ if true +%}\n x {%+ endif %}", "{}"},
      {"comment_trim", "a\n{# c #}\nb  {#- c -#}  d\n  {#- x #}\n", "{}"},
      {"unicode_ws", "a\u3000{{- 'b' -}}\u00a0c\n\u2003{% if true %}x{% endif %}", "{}"},
      {"raw", "{% raw %} {{ x }} {% endraw %}|{%- raw -%}  y  {%- endraw -%}|", "{}"},
      {"numbers", "{{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 10 / 4 }}", "{}"},
      {"floats", "{{ 1.0 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }} {{ 0.0001 }} {{ 0.1 + 0.2 }} {{ 1/3 }} {{ 123456789.123 }} {{ 2.5e-300 }}", "{}"},
      {"json_numbers", "{{ i }} {{ f }} {{ big }} {{ neg }} {{ f * 2 }} {{ i / 2 }}", R"({"i": 3, "f": 3.0, "big": 1e22, "neg": -0.5})"},
      {"strings", R"({{ 'a\nb\t"c"' }}|{{ "it's" }}|{{ 'a\u00e9\x41\101' }}|{{ "\d\q" }}|{{ 'x' "y" 'z' }})", "{}"},
      {"repr", R"({{ ['a\nb', "it's", 'say "hi"', 'both \' "', '\x00\x7f\xa0\u2028é', 1.5, none, true, (1,), {'k': [()]}] }})", "{}"},
      {"compare", "{{ 1 < 2 }}{{ 2 <= 1 }}{{ 'a' == 'a' }}{{ 'b' > 'a' }}{{ 1 < 2 < 3 }}{{ 1 < 3 < 2 }}{{ [1, 2] < [1, 3] }}{{ 1 == 1.0 }}{{ true == 1 }}", "{}"},
      {"logic", "{{ true and false }}{{ 0 or 'x' }}{{ 'y' and 0 }}{{ not none }}{{ none or [] }}{{ missing or 'm' }}", "{}"},
      {"in", "{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in d }}{{ 'q' not in d }}{{ 1 in (1, 2) }}{{ 'x' in missing }}", R"({"d": {"k": 1}})"},
      {"concat", "{{ 'n=' ~ 3 ~ none ~ true ~ missing ~ 1.5 ~ [1] }}", "{}"},
      {"precedence", "{{ 'a' + ' b ' | trim + 'c' }}{{ -2 ** 2 }}{{ 2 * 3 - 1 }}{{ not 1 == 2 }}{{ (1 + 2) | string }}{{ -x | abs }}", R"({"x": 3})"},
      {"condexpr", "{{ 'yes' if flag else 'no' }}[{{ 'a' if false }}]{{ 1 if true else 2 if false }}{{ ('x' if false) is defined }}", R"({"flag": true})"},
      {"getattr", "{{ d.k }}{{ d['k'] }}{{ d.items is defined }}{{ d['items'] }}[{{ d.nope }}][{{ 'ab'.nope }}][{{ xs.nope }}][{{ xs[9] }}]", R"({"d": {"k": "v", "items": 3}, "xs": [1]})"},
      {"slices", "{{ xs[::-1] }}{{ xs[::2] }}{{ xs[1::2] }}{{ xs[-1:0:-1] }}{{ xs[:-2:-1] }}{{ xs[10:] }}{{ xs[-10:2] }}{{ 'héllo'[::-1] }}{{ 'héllo'[1:3] }}", R"({"xs": [1, 2, 3, 4, 5]})"},
      {"if_elif", "{% for n in [0, 1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% elif n %}many{% else %}zero{% endif %},{% endfor %}", "{}"},
      {"for_loop_vars", "{% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.depth }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}", R"({"items": ["a", "b", "c"]})"},
      {"for_filter_else", "{% for x in [1, 2, 3, 4] if x % 2 == 0 %}{{ loop.index }}:{{ x }}/{{ loop.length }}{% else %}none{% endfor %}{% for x in [] %}x{% else %}empty{% endfor %}", "{}"},
      {"for_dict", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for k, v in d | items if k != 'b' %}{{ k }}{% endfor %}", R"({"d": {"z": 1, "b": 2, "a": 3}})"},
      {"for_else_flow", "{% for x in [1, 2] %}{% continue %}{% else %}A{% endfor %}{% for x in [1, 2] %}{% if x == 1 %}{% continue %}{% endif %}{% else %}B{% endfor %}{% for x in [1, 2] %}{% if x == 2 %}{% break %}{% endif %}{% else %}C{% endfor %}", "{}"},
      {"break_continue", "{% for n in range(10) %}{% if n % 2 %}{% continue %}{% endif %}{% if n > 6 %}{% break %}{% endif %}{{ n }}{% endfor %}", "{}"},
      {"nested_loops", "{% for a in [1, 2] %}{% set outer = loop %}{% for b in 'xy' %}{{ outer.index }}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{% endfor %}", "{}"},
      {"scopes", "{% set a = 0 %}{% for x in [1, 2] %}{{ a }}{% set a = a + x %}{{ a }};{% endfor %}{{ a }}{% if true %}{% set b = 1 %}{% endif %}{{ b }}", "{}"},
      {"namespace", "{% set ns = namespace(total=0, items=[]) %}{% for x in [1, 2, 3] %}{% set ns.total = ns.total + x %}{% set ns.items = ns.items + [x] %}{% endfor %}{{ ns.total }}{{ ns.items }}{{ ns }}", "{}"},
      {"set_block", "{% set x %}\n  a{{ 1 }}\n{% endset %}[{{ x }}]{% set y | trim | upper %}  q  {% endset %}[{{ y }}]", "{}"},
      {"macro", "{% macro m(a, b=2, c=none) %}{{ a }}{{ b }}{{ c }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 3, 4, 5) }}|{{ m(c=5, a=0, z=1) }}", "{}"},
      {"macro_caller", "{% macro list(items) %}<{% for i in items %}{{ caller(i) }}{% endfor %}>{% endmacro %}{% call(x) list([1, 2]) %}[{{ x }}]{% endcall %}", "{}"},
      {"filter_block", "{% filter upper | replace('B', '-') %}abc{{ 'b' }}{% endfilter %}", "{}"},
      {"with", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", "{}"},
      {"filters_text", "{{ '  x  ' | trim }}|{{ 'xxay' | trim('xy') }}|{{ none | trim }}|{{ 'hELLO wORLD-x(y' | title }}|{{ 'hELLO' | capitalize }}|{{ 'ab' | upper }}{{ 'AB' | lower }}|{{ 'aXbX' | replace('X', '-', 1) }}|{{ 'abc' | reverse }}|{{ 'a b  c' | wordcount }}|{{ 'x' | center(5) }}|", "{}"},
      {"filters_list", "{{ xs | sort }}{{ xs | sort(reverse=true) }}{{ ws | sort }}{{ ws | sort(case_sensitive=true) }}{{ xs | reverse | list }}{{ ws | unique | list }}{{ xs | max }}{{ xs | min }}{{ xs | sum }}{{ xs | first }}{{ xs | last }}{{ xs | length }}{{ xs | count }}{{ xs | join(', ') }}{{ 'abc' | list }}", R"({"xs": [3, 1, 2], "ws": ["b", "A", "a", "B"]})"},
      {"filters_select", "{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='n') | list }}{{ ms | rejectattr('role', 'equalto', 'user') | list | length }}{{ ms | selectattr('flag') | list | length }}{{ xs | select('odd') | list }}{{ xs | reject('odd') | list }}{{ ['a', 'b'] | map('upper') | join }}{{ ms | map(attribute='missing', default='d') | join }}{{ ms | map(attribute='n') | sum }}{{ ms | sort(attribute='n', reverse=true) | map(attribute='n') | list }}{{ none | select | list }}", R"({"xs": [3, 1, 2], "ms": [{"role": "user", "n": 1, "flag": true}, {"role": "assistant", "n": 2}, {"role": "user", "n": 3}]})"},
      {"filters_dict", "{{ d | dictsort }}{{ d | dictsort(by='value', reverse=true) }}{{ d | items | list }}{{ d | list }}{{ d | length }}{{ missing | items | list }}", R"({"d": {"b": 1, "A": 3, "a": 2}})"},
      {"filters_numbers", "{{ 1.5|round }}{{ 2.5|round }}{{ 3|round }}{{ 2.567|round(2) }}{{ 2.5|round(0, 'floor') }}{{ 2.1|round(method='ceil') }}{{ '3.7'|int }}{{ ' 12 '|int }}{{ '0x1A'|int(0, 16) }}{{ '3'|float }}{{ 'x'|int }}{{ 'x'|float(1.5) }}{{ -3|abs }}{{ 4.0|int }}{{ true|int }}", "{}"},
      {"filters_default", "{{ missing | default('d') }}{{ '' | default('e') }}{{ '' | d('e', true) }}{{ none | default('n') }}{{ 0 | d(5, boolean=true) }}", "{}"},
      {"filters_misc", "{{ 5 | string }}{{ none | string }}{{ [1] | string }}{{ '<a href=\"x\">&' | e }}{{ '<a>' | safe }}{{ '%s=%d' | format('a', 2) }}{{ d | attr('items') is defined }}{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true, true) }}|{{ 'a\n\nb' | indent('> ', blank=true) }}", R"({"d": {"items": 1}})"},
      {"tojson", "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(indent=0) }}|{{ x | tojson(sort_keys=true, separators=(',', ':')) }}|{{ 'é\u2028\x7f' | tojson }}|{{ 'é😀' | tojson(ensure_ascii=true) }}|{{ (1, 2) | tojson }}|{{ {1: 'a', none: 'b', true: 'c'} | tojson }}", R"({"x": {"b": [1, 2.5, null, true, "é\n\"\u0001\t"], "a": {}, "c": [], "d": {"e": [[]]}}})"},
      {"tests", "{{ x is defined }}{{ y is defined }}{{ y is not defined }}{{ y is undefined }}{{ n is none }}{{ s is string }}{{ d is mapping }}{{ s is iterable }}{{ d is sequence }}{{ 3 is number }}{{ true is number }}{{ true is integer }}{{ 1.5 is float }}{{ true is boolean }}{{ false is false }}{{ 1 is true }}{{ 4 is even }}{{ 5 is odd }}{{ 9 is divisibleby 3 }}{{ 'a' is in 'abc' }}{{ 2 is equalto 2 }}{{ 2 is eq 3 }}{{ 2 is ne 3 }}{{ 1 is lt 2 }}{{ 3 is ge 3 }}{{ 3 is greaterthan 2 }}{{ x is sameas 1 }}{{ none is sameas none }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ 'upper' is filter }}{{ 'odd' is test }}{{ range is callable }}{{ d.get is callable }}{{ missing is iterable }}{{ missing is sequence }}", R"({"x": 1, "n": null, "s": "s", "d": {}})"},
      {"str_methods", "{{ ' x '.strip() }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'abc'.startswith('b', 1) }}|{{ \"they're bob\".title() }}|{{ ' x '.lstrip() }}|{{ ' x '.rstrip() }}|{{ 'aBc'.swapcase() }}|{{ 'hello'.capitalize() }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}", "{}"},
      {"str_strip_split", "[{{ '\n\nx\n'.strip('\n') }}][{{ 'xxay'.lstrip('x') }}][{{ 'ayyx'.rstrip('xy') }}][{{ ' a '.strip(none) }}]{{ 'a<b>c<b>'.split('<b>') }}{{ ' a  b '.split() }}{{ '  a b c  '.split(none, 1) }}{{ '  a b c  '.rsplit(none, 1) }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ 'a\nb\r\nc'.splitlines() }}{{ ''.split() }}{{ ''.split(',') }}", "{}"},
      {"str_misc", "{{ 'a-b-c'.replace('-', '+', 1) }}{{ 'abcb'.find('b') }}{{ 'abcb'.rfind('b') }}{{ 'abcb'.find('z') }}{{ 'abcb'.count('b') }}{{ 'héllo'.index('l') }}{{ ', '.join(['x', 'y']) }}{{ '{} {}'.format(1, 'x') }}{{ '{0}{name}{{}}'.format('a', name='b') }}{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ ' '.isspace() }}{{ '7'.zfill(3) }}{{ 'ab'.center(6, '*') }}{{ 'a=b=c'.partition('=') }}{{ 'a=b=c'.rpartition('=') }}{{ 'prefix_x'.removeprefix('prefix_') }}", "{}"},
      {"dict_list_methods", "{{ d.get('k') }}{{ d.get('q', 'dflt') }}{{ d.get('q') }}{{ d.keys() | list }}{{ d.values() | list }}{{ d.items() | list }}{{ [1, 2, 1].count(1) }}{{ [1, 2].index(2) }}{{ d.copy() }}", R"({"d": {"k": "v", "n": [1]}})"},
      {"globals", "{{ range(3) | list }}{{ range(1, 8, 3) | list }}{{ range(3, -1, -1) | list }}{{ range(0, 3, -1) | list }}{{ dict(a=1, b='x') }}{{ dict([('a', 1)], c=2) }}{{ namespace(a=1).a }}{{ strftime_now('%Y') | length }}", "{}"},
      {"raise", "a{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}", "{}"},
      {"undefined_attr_error", "{{ x.y }}", "{}"},
      {"undefined_item_error", "{{ xs[5].a }}", R"({"xs": [1]})"},
      {"undefined_dict_error", "{{ d.a.b }}", R"({"d": {}})"},
      {"undefined_in_add", "{{ 'a' + missing }}", "{}"},
      {"type_error", "{{ 'abc' + 1 }}", "{}"},
      {"unsafe_append", "{{ [1, 2].append(3) }}", "{}"},
      {"syntax_unclosed", "{% if x %}a", "{}"},
      {"syntax_unknown_filter", "{{ x | nosuch }}", "{}"},
      {"syntax_deferred_filter", "{% if false %}{{ x | nosuch }}{% endif %}ok{{ 1 if true else (x | nosuch) }}", "{}"},
      {"syntax_unknown_tag", "{% foo %}", "{}"},
      {"syntax_break_outside", "{% break %}", "{}"},
      {"not_iterable", "{% for x in 5 %}{% endfor %}", "{}"},
      {"macro_too_many", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", "{}"},
      {"generators", "{% set g = xs | select('odd') %}{% if [] | select %}truthy{% endif %}{% for x in g %}{{ x }}{% endfor %}[{% for x in g %}{{ x }}{% endfor %}]{{ d.items() }}{{ d.keys() }}{{ d.values() | list }}{{ range(3) }}{{ range(1, 9, 2) }}{{ range(4)[1] }}{{ range(4) | length }}{{ xs | reverse | list }}{{ 'x' in d.keys() }}{{ xs | unique | list }}{{ d.items() | length }}", R"({"xs": [3, 1, 2, 3], "d": {"x": 1, "y": [2]}})"},
      {"generator_len", "{{ [1, 2] | select | length }}", "{}"},
      {"generator_json", "{{ [1, 2] | map('string') | tojson }}", "{}"},
      {"view_json", "{{ {'a': 1}.items() | tojson }}", "{}"},
      {"generator_item", "{{ ([1, 2] | select)[0] }}|{{ {'a': 1}.keys()[0] }}|", "{}"},
      {"generator_last", "{{ [1, 2] | select | last }}", "{}"},
      {"filters_groupby", "{% for role, items in ms | groupby('role') %}{{ role }}={{ items | map(attribute='n') | join(',') }};{% endfor %}{% for g in ms | groupby('role', case_sensitive=true) %}{{ g.grouper }}:{{ g.list | length }}{{ g[1][0].n }};{% endfor %}{{ ms | groupby('tool', default='none') | map(attribute='grouper') | list }}{{ [[1, 'x'], [2, 'y'], [1, 'z']] | groupby(0) }}{{ ms | groupby('n') | first | tojson }}", R"({"ms": [{"role": "user", "n": 1}, {"role": "assistant", "n": 2}, {"role": "User", "n": 3}]})"},
      {"filters_wordwrap", "{{ s | wordwrap(12) }}|{{ s | wordwrap(9, wrapstring='<br>') }}|{{ s | wordwrap(4, break_long_words=false) }}|{{ s | wordwrap(6, break_on_hyphens=false) }}|{{ s | wordwrap(5, wrapstring='<br>' | safe) }}|{{ '' | wordwrap }}", R"({"s": "Look, goof-ball -- use the -b option!\n\nstate-of-the-art  \t supercalifragilistic <tag> d\u00e9j\u00e0-vu"})"},
      {"wordwrap_width_zero", "{{ 'a' | wordwrap(0) }}", "{}"},
      {"include", "a\n{% include 'other.jinja' %}", "{}"},
      {"extends", "{% extends 'base.jinja' %}", "{}"},
      {"import", "{% import 'macros.jinja' as m %}", "{}"},
      {"from_import", "{% from 'macros.jinja' import m %}", "{}"},
      {"messages_template", "{% for m in messages %}{{ m['role'] | upper }}: {{ m.content | trim }}{% if not loop.last %}\n{% endif %}{% endfor %}", R"({"messages": [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo\n"}]})"},
  };
  return k;
}

// The parity script: transformers' own compiled environment when importable, else the same
// environment rebuilt from jinja2 (ImmutableSandboxedEnvironment + the same globals/filters).
constexpr const char* kParityScript = R"PY(
import json, sys
from datetime import datetime

def environment():
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
        return _compile_jinja_template, "transformers"
    except Exception:
        import jinja2, jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)
        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        def strftime_now(format):
            return datetime.now().strftime(format)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        return env.from_string, "jinja2"

compile_template, origin = environment()
spec = json.load(open(sys.argv[1], encoding="utf-8"))
results = []
for case in spec["cases"]:
    try:
        text = compile_template(spec["templates"][case["template"]]).render(**case["context"])
        results.append({"ok": True, "text": text})
    except Exception as e:
        results.append({"ok": False, "type": type(e).__name__, "message": str(e)})
json.dump({"origin": origin, "results": results}, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
)PY";

std::filesystem::path source_dir() {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return src != nullptr ? src : ".";
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << p;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The Qwen3 template from shared/golden's tokenizer_config.json, and the fixtures of
// tests/workers/tokenizer/chat_templates (see the README there for their sources).
std::map<std::string, std::string> chat_templates() {
  std::map<std::string, std::string> t;
  const char* shared = std::getenv("TESSERA_SHARED_DIR");
  const auto config = std::filesystem::path(shared != nullptr ? shared : "../shared") / "golden" / "qwen3-tokenizer" /
                      "tokenizer_config.json";
  t["qwen3"] = nlohmann::json::parse(read_file(config)).at("chat_template").get<std::string>();
  for (const char* name : {"qwen2.5-instruct", "llama-3.1-instruct", "llama-3.2-instruct", "mistral-7b-instruct-v0.3",
                           "gemma-2-it", "deepseek-r1-distill-qwen"}) {
    t[name] = read_file(source_dir() / "tests" / "workers" / "tokenizer" / "chat_templates" / (std::string(name) + ".jinja"));
  }
  return t;
}

// The special tokens each model's tokenizer passes to its template (special_tokens_map).
ojson special_tokens(const std::string& name) {
  if (name.rfind("qwen", 0) == 0) return {{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}};
  if (name.rfind("llama", 0) == 0) return {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}};
  if (name.rfind("mistral", 0) == 0) return {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}};
  if (name.rfind("gemma", 0) == 0) {
    return {{"bos_token", "<bos>"}, {"eos_token", "<eos>"}, {"pad_token", "<pad>"}, {"unk_token", "<unk>"}};
  }
  return {{"bos_token", "<｜begin▁of▁sentence｜>"}, {"eos_token", "<｜end▁of▁sentence｜>"}};
}

// Template-specific keyword arguments (apply_chat_template's **kwargs) to try besides none.
std::vector<ojson> extra_kwargs(const std::string& name) {
  std::vector<ojson> v = {ojson::object()};
  if (name == "qwen3") {
    v.push_back({{"enable_thinking", false}});
    v.push_back({{"enable_thinking", true}});
  }
  if (name.rfind("llama", 0) == 0) {
    v.push_back({{"date_string", "26 Jul 2024"}});
    v.push_back({{"date_string", "01 Jan 2025"}, {"tools_in_user_message", false}});
    v.push_back({{"builtin_tools", {"brave_search", "wolfram_alpha"}}});
  }
  return v;
}

constexpr const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"},
      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "brave_search", "description": "Search the web — quickly.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
])";

// Conversations: plain turns, system prompts, multi-turn, reasoning, tool calls and results,
// unicode and whitespace, and shapes some templates reject (their errors must match too).
constexpr const char* kConversations = R"({
  "user": [{"role": "user", "content": "Hello!"}],
  "system_user": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
  "multi_turn": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}],
  "ends_with_assistant": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"},
    {"role": "user", "content": "Tell me a joke."}, {"role": "assistant", "content": "Why did the chicken cross the road?"}],
  "think_in_content": [{"role": "user", "content": "What is 3*7?"},
    {"role": "assistant", "content": "<think>\n3*7 is 21.\n</think>\n\nThe answer is 21."},
    {"role": "user", "content": "And 4*5?"}],
  "think_last_turn": [{"role": "user", "content": "What is 3*7?"},
    {"role": "assistant", "content": "<think>\nthink A\n</think>\n\nA"}, {"role": "user", "content": "Again?"},
    {"role": "assistant", "content": "<think>\nthink B\n</think>\n\nB"}],
  "reasoning_content": [{"role": "user", "content": "Why?"},
    {"role": "assistant", "content": "Because.", "reasoning_content": "\nLet me think.\n"}],
  "tool_call_dict_args": [{"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call12345", "type": "function",
      "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
    {"role": "tool", "tool_call_id": "call12345", "content": "{\"temperature\": 18}"},
    {"role": "assistant", "content": "It is 18°C in Paris."}],
  "tool_call_string_args": [{"role": "user", "content": "Search for jinja."},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "abcDEF123", "type": "function",
      "function": {"name": "brave_search", "arguments": "{\"query\": \"jinja\"}"}}]},
    {"role": "tool", "tool_call_id": "abcDEF123", "content": "Jinja is a template engine."}],
  "parallel_tools": [{"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "Checking both.", "tool_calls": [
      {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
      {"id": "call00002", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
    {"role": "tool", "tool_call_id": "call00001", "content": "18"},
    {"role": "tool", "tool_call_id": "call00002", "content": "25"},
    {"role": "user", "content": "<tool_response>\nnot really\n</tool_response>"}],
  "unicode_whitespace": [{"role": "system", "content": "  Système: réponds en français.\n\n"},
    {"role": "user", "content": "\n  你好，世界 🌍  \t\n"}, {"role": "assistant", "content": "  Bonjour ! {{ not a tag }} {% x %}  "},
    {"role": "user", "content": "Ünïcode\u00a0and\u2028separators"}],
  "system_only": [{"role": "system", "content": "Only a system prompt."}],
  "empty": [],
  "not_alternating": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
  "assistant_first": [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "ok"}]
})";

struct ParityCase {
  std::string name;
  std::string template_name;
  ojson context;
};

std::vector<ParityCase> chat_cases(const std::map<std::string, std::string>& templates) {
  std::vector<ParityCase> cases;
  const ojson conversations = ojson::parse(kConversations);
  const ojson tools = ojson::parse(kTools);
  for (const auto& t : templates) {
    for (auto conv = conversations.begin(); conv != conversations.end(); ++conv) {
      for (const bool with_tools : {false, true}) {
        for (const bool gen : {false, true}) {
          for (const ojson& extra : extra_kwargs(t.first)) {
            ojson ctx = {{"messages", conv.value()}, {"tools", with_tools ? tools : ojson(nullptr)},
                         {"documents", nullptr}, {"add_generation_prompt", gen}};
            const ojson tokens = special_tokens(t.first);
            for (auto it = tokens.begin(); it != tokens.end(); ++it) ctx[it.key()] = it.value();
            for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
            cases.push_back({t.first + "/" + conv.key() + (with_tools ? "/tools" : "") + (gen ? "/gen" : "") +
                                 (extra.empty() ? "" : "/" + extra.dump()),
                             t.first, std::move(ctx)});
          }
        }
      }
    }
  }
  return cases;
}

// Where two renderings first differ, with a little context, for failure messages.
std::string first_difference(const std::string& want, const std::string& got) {
  size_t k = 0;
  while (k < want.size() && k < got.size() && want[k] == got[k]) ++k;
  const size_t from = k > 40 ? k - 40 : 0;
  return fmt::format("at byte {}:\n  python: {}\n  tessera: {}", k, ojson(want.substr(from, 120)).dump(),
                     ojson(got.substr(from, 120)).dump());
}

class JinjaParity : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* py = std::getenv("TESSERA_PYTHON");
    if (py == nullptr || *py == '\0') GTEST_SKIP() << "TESSERA_PYTHON (with jinja2, ideally transformers) is not set";
    python_ = py;
    dir_ = std::filesystem::temp_directory_path() / ("tessera_jinja_" + std::to_string(::getpid()) + "_" +
                                                      ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Renders every case in Python; returns its results (and the environment it used).
  ojson run_python(const std::map<std::string, std::string>& templates, const std::vector<ParityCase>& cases) {
    ojson spec = {{"templates", templates}, {"cases", ojson::array()}};
    for (const auto& c : cases) spec["cases"].push_back({{"template", c.template_name}, {"context", c.context}});
    std::ofstream(dir_ / "cases.json", std::ios::binary) << spec.dump();
    std::ofstream(dir_ / "render.py") << kParityScript;
    const std::string cmd = fmt::format("'{}' '{}' '{}' '{}'", python_, (dir_ / "render.py").string(),
                                        (dir_ / "cases.json").string(), (dir_ / "out.json").string());
    if (std::system(cmd.c_str()) != 0 || !std::filesystem::exists(dir_ / "out.json")) {
      ADD_FAILURE() << "the reference renderer failed (does " << python_ << " have jinja2?): " << cmd;
      return ojson::array();
    }
    ojson out = ojson::parse(read_file(dir_ / "out.json"));
    std::cout << "[ parity  ] reference: " << out.at("origin").get<std::string>() << "'s environment, " << cases.size()
              << " cases\n";
    return out.at("results");
  }

  struct Tally {
    int rendered = 0;
    int errors = 0;
  };

  // Compares one case; returns false on a mismatch.
  static bool compare(const ParityCase& c, const std::string& tmpl, const ojson& want, Tally& tally, bool verbose) {
    auto parsed = Template::parse(tmpl, c.template_name);
    Result<std::string> got = parsed.ok() ? parsed->render(c.context) : Result<std::string>(parsed.status());
    if (want.at("ok").get<bool>()) {
      if (!got.ok()) {
        ADD_FAILURE() << c.name << ": python rendered, tessera failed: " << got.status().to_string();
        return false;
      }
      const std::string text = want.at("text").get<std::string>();
      if (*got != text) {
        ADD_FAILURE() << c.name << ": output differs " << first_difference(text, *got);
        return false;
      }
      ++tally.rendered;
      return true;
    }
    const std::string type = want.at("type").get<std::string>(), message = want.at("message").get<std::string>();
    if (got.ok()) {
      ADD_FAILURE() << c.name << ": python raised " << type << " (" << message << "), tessera rendered "
                    << ojson(*got).dump();
      return false;
    }
    // raise_exception's text and undefined/security messages are jinja2's own; others vary in wording.
    if ((type == "TemplateError" || type == "UndefinedError" || type == "SecurityError" ||
         type == "TemplateAssertionError") &&
        got.status().message().find(message) == std::string::npos) {
      ADD_FAILURE() << c.name << ": python raised " << type << ": " << message << "\n  tessera: " << got.status().message();
      return false;
    }
    ++tally.errors;
    if (verbose) std::cout << "[ parity  ] " << c.name << ": both raised " << type << ": " << message << "\n";
    return true;
  }

  std::string python_;
  std::filesystem::path dir_;
};

TEST_F(JinjaParity, LanguageSnippetsMatchJinja2) {
  std::map<std::string, std::string> templates;
  std::vector<ParityCase> cases;
  for (const auto& [name, tmpl, ctx] : snippets()) {
    templates[name] = tmpl;
    cases.push_back({name, name, ojson::parse(ctx)});
  }
  const ojson results = run_python(templates, cases);
  ASSERT_EQ(results.size(), cases.size());
  Tally tally;
  for (size_t k = 0; k < cases.size(); ++k) compare(cases[k], templates.at(cases[k].template_name), results[k], tally, /*verbose=*/true);
  std::cout << "[ parity  ] snippets: " << tally.rendered << " rendered identically, " << tally.errors
            << " raised in both\n";
  EXPECT_GE(tally.rendered, 50);
}

TEST_F(JinjaParity, RealChatTemplatesMatchTransformers) {
  const auto templates = chat_templates();
  const auto cases = chat_cases(templates);
  const ojson results = run_python(templates, cases);
  ASSERT_EQ(results.size(), cases.size());
  std::map<std::string, Tally> per_template;
  int failures = 0;
  for (size_t k = 0; k < cases.size() && failures < 20; ++k) {
    if (!compare(cases[k], templates.at(cases[k].template_name), results[k], per_template[cases[k].template_name], /*verbose=*/false)) {
      ++failures;
    }
  }
  for (const auto& [name, tally] : per_template) {
    std::cout << "[ parity  ] " << name << ": " << tally.rendered << " rendered identically, " << tally.errors
              << " raised in both\n";
    EXPECT_GE(tally.rendered, 20) << name << " rendered too few conversations to mean anything";
  }
}

}  // namespace
}  // namespace tessera::jinja
