#!/usr/bin/env python3
"""Builds the SentencePiece-style tokenizer.json fixtures and their HF goldens.

Run from the repository root with the HF `tokenizers` package (PyPI) installed:

    .venv/bin/python tests/workers/tokenizer/spm/make_fixtures.py

It writes, beside this script:
  mistral/tokenizer.json   the shape of mistralai/Mistral-7B-Instruct-v0.3 (and v0.1/v0.2):
                           normalizer Sequence[Prepend "▁", Replace " " -> "▁"], no
                           pre-tokenizer, BPE with byte_fallback + fuse_unk, <unk>/<s>/</s> and
                           [INST]-style control tokens as special added tokens, TemplateProcessing
                           "<s> $A", decoder Sequence[Replace "▁" -> " ", ByteFallback, Fuse,
                           Strip(" ", 1, 0)].
  gemma/tokenizer.json     the shape of google/gemma-2-9b-it (GemmaConverter): normalizer
                           Replace " " -> "▁", pre-tokenizer Split(" ", MergedWithPrevious),
                           BPE with byte_fallback, "\t" in the vocab, <start_of_turn> /
                           <end_of_turn> special, TemplateProcessing "<bos> $A", decoder
                           Sequence[Replace, ByteFallback, Fuse].
  metaspace/tokenizer.json transformers' LlamaConverter with legacy=false (how recent
                           transformers converts Llama-2 / Mistral SentencePiece models): no
                           normalizer, Metaspace(prepend_scheme "first", split false).
  legacy/tokenizer.json    an older serialisation: Metaspace with add_prefix_space/str_rep (no
                           prepend_scheme, split defaulting to true), Metaspace decoder, byte
                           tokens only for ASCII (so other characters become unfused <unk>),
                           ignore_merges true.
  golden.json              for every fixture and text (TEXTS, then seeded random mixes): encode ids without and with special
                           tokens, and decode of those ids with and without skip_special_tokens,
                           all computed by `tokenizers` itself; plus decode-only id lists.

The vocabularies are small: a BPE trained here on a tiny English corpus (merges stay inside
"▁word" pieces, as SentencePiece's do), after the special tokens and the <0xXX> byte tokens in
the order the real files use. Nothing is downloaded. Output is deterministic.
"""
import json
import pathlib
import random

import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = pathlib.Path(__file__).resolve().parent

CORPUS = [
    "Hello world, this is a tiny corpus for a tiny tokenizer.",
    "The quick brown fox jumps over the lazy dog. The dog sleeps.",
    "What is 2+2? It is 4. What is the answer to everything?",
    "def f(x):\n    return x * 2\n\nprint(f(21))",
    "Tokenizers split text into tokens; tokens become ids.",
    "café, naïve and résumé are French words used in English.",
    "Mistral and Gemma ship SentencePiece models converted to tokenizer.json.",
    "user model assistant system instruction hello there how are you today",
] * 4

MISTRAL_CONTROL = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                   "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]

TEXTS = [
    "",
    "Hello world",
    "Hello world, this is a test.",
    " Hello",
    "  two leading spaces",
    "trailing spaces  ",
    "a   b    c     d",
    "   ",
    " ",
    "\n",
    "line one\nline two\r\n\ttabbed\t\tend",
    "def f(x):\n    return x * 2\n",
    "<s>[INST] What is 2+2? [/INST] It is 4.</s>[INST] And 3+3? [/INST]",
    "[INST]What is 2+2?[/INST]",
    "a <s> b </s> c",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\n  spaced <end_of_turn>",
    "日本語のテキストです。",
    "中文 and English mixed",
    "emoji 😀👍🏽 and 🇫🇷 flags",
    "e\u0301 combining acute, a\u0308 and \u0915\u094d\u0937",
    "café naïve résumé",
    "Ωmega ω ß ﬁ",
    "\u00a0non-breaking\u2003em space",
    "▁ literal metaspace ▁▁ and ▁word",
    "<0x41> looks like a byte token",
    "<table><tr>hello world</tr></table>",
    "hello world",
    "unknown ☃ snowman and 𝄞 clef",
    "The quick brown fox jumps over the lazy dog.",
    "snow☃~`|end ☃☃ \x01\x7f",  # legacy: an <unk> still pending while byte tokens are added
]

# Seeded random mixes of the hard parts, so the goldens also cover their combinations.
FRAGMENTS = ["Hello", "the", "world", "x", "123", ".", ",", "?", " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n",
             "日本", "😀", "👍🏽", "e\u0301", "café", "☃", "~", "▁", "<0x41>", "<s>", "</s>", "[INST]", "[/INST]",
             "<bos>", "<start_of_turn>", "<end_of_turn>", "<table>", "hello world", "\u00a0", "\x01"]


def random_texts(n=60, seed=20261126):
    rng = random.Random(seed)
    return ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def train():
    """A small BPE over "▁word" pieces; returns (vocab in id order, merges)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(vocab_size=300, min_frequency=2, limit_alphabet=70, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    return vocab, model["merges"]


def byte_tokens(limit=256):
    return [f"<0x{b:02X}>" for b in range(limit)]


def vocab_dict(prefix, trained):
    vocab = {}
    for t in prefix + trained:
        vocab.setdefault(t, len(vocab))
    return vocab


def bpe(vocab, merges, *, fuse_unk=True, ignore_merges=False):
    return models.BPE(vocab=vocab, merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges],
                      unk_token="<unk>", fuse_unk=fuse_unk, byte_fallback=True, dropout=None,
                      ignore_merges=ignore_merges)


def spm_decoder(strip):
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if strip:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    return decoders.Sequence(steps)


def special(content):
    return AddedToken(content, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)


def mistral(trained, merges):
    prefix = ["<unk>", "<s>", "</s>"] + MISTRAL_CONTROL + byte_tokens()
    tok = Tokenizer(bpe(vocab_dict(prefix, trained), merges))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = None
    tok.decoder = spm_decoder(strip=True)
    tok.add_special_tokens([special(t) for t in ["<unk>", "<s>", "</s>"] + MISTRAL_CONTROL])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return tok


def gemma(trained, merges):
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[@BOS@]", "<unused0>", "<unused1>",
                "<start_of_turn>", "<end_of_turn>"]
    prefix = specials + ["\t"] + byte_tokens()[:9] + byte_tokens()[10:] + ["<table>", "<tr>", "</tr>", "</table>"]
    tok = Tokenizer(bpe(vocab_dict(prefix, trained), merges))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = spm_decoder(strip=False)
    tok.add_special_tokens([special(t) for t in specials])
    # Gemma's user-defined SentencePiece pieces (HTML tags, ...) are plain added tokens,
    # normalized=false; one normalized=true token exercises the normalized matcher.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ["<table>", "<tr>", "</tr>", "</table>"]])
    tok.add_tokens([AddedToken("hello world", special=False, normalized=True)])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return tok


def metaspace(trained, merges):
    prefix = ["<unk>", "<s>", "</s>"] + byte_tokens()
    tok = Tokenizer(bpe(vocab_dict(prefix, trained), merges))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = spm_decoder(strip=True)
    tok.add_special_tokens([special(t) for t in ["<unk>", "<s>", "</s>"]])
    tok.add_special_tokens([AddedToken("[INST]", special=True, normalized=False, lstrip=True, rstrip=True)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def legacy(trained, merges):
    prefix = ["<unk>", "<s>", "</s>"] + byte_tokens(128)
    tok = Tokenizer(bpe(vocab_dict(prefix, trained), merges, fuse_unk=False, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="always")])
    tok.add_special_tokens([special(t) for t in ["<unk>", "<s>", "</s>"]])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    j = json.loads(tok.to_str())
    # The pre-0.19 serialisation of Metaspace (still in many Hub files).
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True, "str_rep": "▁"}
    j["decoder"]["decoders"][1] = {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True}
    return Tokenizer.from_str(json.dumps(j))


def decode_only(tok):
    """Id lists that encode() never produces: split UTF-8, leading ▁ runs, bare specials."""
    def ids(*tokens):
        out = [tok.token_to_id(t) for t in tokens]
        return [i for i in out if i is not None]
    return [
        ids("<0xE6>", "<0x97>"),                      # an incomplete character -> one U+FFFD per byte
        ids("<0xE6>", "<0x97>", "<0xA5>", "<0xE6>"),  # a whole character, then a dangling byte
        ids("▁▁", "▁the", "▁▁"),
        ids("▁", "▁", "a"),
        ids("<s>", "▁Hello", "</s>"),
        ids("<bos>", "<start_of_turn>", "▁Hello", "<end_of_turn>"),
        ids("<0x41>", "<s>", "<0x42>"),
        ids("\t", "▁x"),
    ]


def cases(tok):
    out = []
    for text in TEXTS + random_texts():
        plain = tok.encode(text, add_special_tokens=False).ids
        with_special = tok.encode(text, add_special_tokens=True).ids
        out.append({
            "text": text,
            "ids": plain,
            "ids_with_special": with_special,
            "decoded": tok.decode(plain, skip_special_tokens=False),
            "decoded_skip": tok.decode(plain, skip_special_tokens=True),
            "decoded_with_special": tok.decode(with_special, skip_special_tokens=False),
            "decoded_with_special_skip": tok.decode(with_special, skip_special_tokens=True),
        })
    decodes = [{"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip": tok.decode(ids, skip_special_tokens=True)}
               for ids in decode_only(tok) if ids]
    return out, decodes


def main():
    trained, merges = train()
    golden = {"tokenizers_version": tokenizers.__version__, "fixtures": {}}
    for name, build in [("mistral", mistral), ("gemma", gemma), ("metaspace", metaspace), ("legacy", legacy)]:
        tok = build(trained, merges)
        text = tok.to_str(pretty=True)
        if name == "legacy":  # keep the legacy Metaspace spelling on disk
            j = json.loads(text)
            j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True, "str_rep": "▁"}
            j["decoder"]["decoders"][1] = {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True}
            text = json.dumps(j, indent=2, ensure_ascii=False)
        (HERE / name).mkdir(exist_ok=True)
        (HERE / name / "tokenizer.json").write_text(text + "\n", encoding="utf-8")
        reloaded = Tokenizer.from_file(str(HERE / name / "tokenizer.json"))
        encode_cases, decode_cases = cases(reloaded)
        golden["fixtures"][name] = {"cases": encode_cases, "decode_cases": decode_cases}
    (HERE / "golden.json").write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
