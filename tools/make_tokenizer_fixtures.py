#!/usr/bin/env python3
"""Tokenizer oracle fixtures for Kestrel's tokenizer tests (tests/data/tokenizers/).

Run with the oracle environment (tokenizers 0.23, transformers, gguf):

    /opt/oracle/bin/python tools/make_tokenizer_fixtures.py [--llama-sdist PATH] [--out tests/data/tokenizers]

What it writes:
  corpus.jsonl                one JSON string per line, shared by every tokenizer (deterministic, 10,000+ strings)
  <name>/tokenizer.json       the tokenizer (real vocabularies rebuilt from llama.cpp's vocab-only GGUF files, or
                              generated with HF tokenizers' trainer)
  <name>/tokenizer_config.json  where the family has one (bos/eos, add_bos_token, a chat template)
  <name>/ids.bin              expected ids of every corpus string, `Tokenizer.encode(text, add_special_tokens=True)`:
                              per case a LEB128 varint count, then that many LEB128 varint ids
  <name>/decode.jsonl         first line {"prefix", "suffix", "skip_prefix", "skip_suffix"}: decode(ids) of a case is
                              expected to be prefix + text + suffix (skip_special_tokens=False) and skip_prefix + text +
                              skip_suffix (True); then {"i": case, "text": ..., "skip": ...} for every case whose decode is
                              something else (either key may be absent; "skip": null means the same as "text")

Real tokenizers (vocab + merges from the `llama-cpp-python` sdist on PyPI, vendor/llama.cpp/models/ggml-vocab-*.gguf;
the pre-tokenizer of each family as the model's own tokenizer.json has it; llama.cpp's *.gguf.inp/.out expected
tokenizations are checked against the rebuilt tokenizer, so a wrong rebuild fails here):
  gpt2            GPT-2: ByteLevel pre-tokenizer with its built-in regex, normalized special <|endoftext|>
  qwen2           Qwen2: NFC, Split(regex, (?i:...), \\p{N}) + ByteLevel(use_regex=false)
  deepseek_coder  DeepSeek-Coder: Sequence of five Splits + ByteLevel, BOS by TemplateProcessing
  llama_spm       Llama 2 (sentencepiece BPE): Prepend/Replace normalizer, byte_fallback, unk, BOS, the
                  Replace/ByteFallback/Fuse/Strip decoder; merges from the vocab scores by transformers'
                  `generate_merges` (as its LlamaConverter does)
Generated tokenizers (trained here):
  glm_bpe         byte-level BPE with GLM-4's pre-tokenizer regex (\\p{N}{1,3}) and GLM-5.3's special tokens
  gen_metaspace   NFKC + Lowercase + Replace(regex), Digits + Punctuation + Metaspace(first), unk, added-token flags
  gen_misc        NFD + Replace(string) + Strip + Prepend, Whitespace + WhitespaceSplit pre-tokenizers, byte_fallback,
                  ignore_merges, continuing_subword_prefix / end_of_word_suffix, normal added tokens
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import unicodedata

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers.convert_slow_tokenizer import generate_merges

GLM4_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
GLM53_SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                  "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
                  "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>",
                  "<|end_of_transcription|>", "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "<think>",
                  "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>",
                  "</arg_key>", "<arg_value>", "</arg_value>", "/nothink", "<|begin_of_box|>", "<|end_of_box|>",
                  "<|image|>", "<|video|>"]

# Special-token strings of all families, inlined into corpus strings.
INLINE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>",
                   "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<|EOT|>", "[gMASK]", "<sop>", "<|user|>",
                   "<|assistant|>", "<|system|>", "<|observation|>", "<think>", "</think>", "<tool_call>",
                   "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink", "[MASK]",
                   "<mask>", "<KEEP>", "<Lower>", "<sp_word>", "<rs>", "<ls>", "<both>", "<raw>"]


# ----------------------------------------------------------------------------------------------------------------
# Corpus
# ----------------------------------------------------------------------------------------------------------------

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.", "I'm sure they'll say it's what we've done; you'd agree?",
    "HELLO WORLD! Don't SHOUT, it's RUDE.", "Hello, world!", " this is 🦙.cpp", "w048 7tuijk dsdfhu",
    "нещо на Български", "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.", "Äpfel, Öl und Übermut — straße STRASSE",
    "Voix ambiguë d'un cœur qui au zéphyr préfère les jattes de kiwis.", "El pingüino Wenceslao hizo kilómetros bajo exhaustiva lluvia y frío, añoraba a su querido cachorro.",
    "Pchnąć w tę łódź jeża lub ośm skrzyń fig.", "Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Árvíztűrő tükörfúrógép", "Kæmi ný öxi hér ykist þjófum nú bæði víl og ádrepa.",
    "Γαζέες καὶ μυρτιὲς δὲν θὰ βρῶ πιὰ στὸ χρυσαφὶ ξέφωτο.", "Τάχιστη αλώπηξ βαφής ψημένη γη, δρασκελίζει υπέρ νωθρού κυνός",
    "דג סקרן שט בים מאוכזב ולפתע מצא חברה", "صِف خَلقَ خَودِ كَمِثلِ الشَمسِ إِذ بَزَغَت — يَحظى الضَجيعُ بِها نَجلاءَ مِعطارِ",
    "مرحبا بالعالم! كيف حالك اليوم؟ ١٢٣٤٥٦٧٨٩٠", "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम",
    "नमस्ते दुनिया, यह एक परीक्षण है। १२३", "আমি বাংলায় গান গাই", "ਪੰਜਾਬੀ ਭਾਸ਼ਾ", "தமிழ் மொழி அழகானது",
    "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน", "ພາສາລາວ", "မြန်မာဘာသာ", "ភាសាខ្មែរ",
    "いろはにほへと ちりぬるを わかよたれそ つねならむ", "日本語のテキストです。カタカナとひらがな、漢字。",
    "我能吞下玻璃而不伤身体。", "中华人民共和国成立于1949年10月1日。", "繁體中文測試：臺灣、香港。",
    "다람쥐 헌 쳇바퀴에 타고파", "한국어 텍스트입니다. 안녕하세요!", "Tiếng Việt có dấu: Trăm năm trong cõi người ta",
    "ქართული ენა", "Հայերեն լեզու", "ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ", "ⴰⵣⵓⵍ ⴼⵍⵍⴰⵡⵏ", "ᠮᠣᠩᠭᠣᠯ ᠪᠢᠴᠢᠭ", "བོད་ཡིག", "አማርኛ ቋንቋ",
    "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ (only emoji that has its own token)",
    "👨‍👩‍👧‍👦 family, 👍🏽 thumbs, 🏳️‍🌈 flag, 🇩🇪🇯🇵 flags, 🧑🏿‍💻 coder, ❤️‍🔥",
    "Hello 👋🏻👋🏼👋🏽👋🏾👋🏿 world 🌍🌎🌏", "e\u0301 vs \u00e9, A\u030a vs \u00c5, \u1e9b\u0323, ﬁ ﬂ ﬀ ㎏ ℌ ① ⅷ",
    "Full-width: ＡＢＣ１２３！", "Ligatures ﬁnally ﬂow; ½ ¾ ² ³ µ Ω Å K", "İstanbul ıi İI ǅ ǈ ß ẞ ﬆ",
    "ΣΊΣΥΦΟΣ ὈΔΥΣΣΕΎΣ", "Tab\tseparated\tvalues\n1\t2\t3\n", "line1\nline2\r\nline3\rline4\n\n\n",
    "   leading spaces", "trailing spaces   ", "   ", "\t\t\t", "\n", " \n \n ", "a  b   c    d",
    "3333333333", "1234567890123456789", "3.14159 2.71828 -42 +7 1e-9 0x1F 0b1010 1,000,000.50",
    "Version 2.0.1-beta+build.42", "$100.00 €50 £30 ¥1000 ₹500", "2024-01-15T10:30:00Z",
    "supercalifragilisticexpialidocious", "pneumonoultramicroscopicsilicovolcanoconiosis",
    "Llanfairpwllgwyngyllgogerychwyrndrobwllllantysiliogogogoch", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "ab" * 30, "The\u00a0non-breaking\u2009thin\u200bzero\u2028line\u2029para\u3000ideographic\u0085nel\u180emongol",
    "zero\u200dwidth\u200cjoiner\ufeffbom", "soft\u00adhyphen", "控制字符\u0001\u0002\u001f\u007f",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D 'ſ", "don't won't can't shouldn't y'all",
]

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\n\nint main(void) {\n\tprintf(\"Hello, %s!\\n\", \"world\");\n\treturn 0;\n}\n",
    "for (auto& [key, value] : map) { std::cout << key << \" => \" << value << '\\n'; }",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "const x = async () => { await fetch(`/api/v1/items?id=${id}&q=${encodeURIComponent(q)}`); };",
    "<html><body><div class=\"main\" id='x'>&amp; &lt;tag&gt;</div></body></html>",
    "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    Ok(())\n}",
    "import numpy as np\narr = np.zeros((3, 4), dtype=np.float32)\nprint(arr.shape)  # (3, 4)\n",
    "    \n\t  \n        indented();\n", "a==b!=c<=d>=e&&f||g<<h>>i**j//k->l::m",
    "// comment\n/* block\n   comment */\n#define MAX(a,b) ((a)>(b)?(a):(b))",
    "$ ls -la | grep '\\.py$' | wc -l && echo \"done\" > /dev/null 2>&1",
    "{{ messages[0]['content'] | trim }}{% for m in messages %}{{ m.role }}{% endfor %}",
]


def random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rng.randint(-10**6, 10**6)
    if kind == 1:
        return round(rng.uniform(-1000, 1000), rng.randrange(6))
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return rng.choice(SENTENCES)[: rng.randrange(1, 30)]
    if kind in (4, 5):
        return {rng.choice(["name", "arguments", "type", "id", "content", "role", "城市", "ключ"]) + str(i):
                random_json(rng, depth + 1) for i in range(rng.randrange(1, 4))}
    return [random_json(rng, depth + 1) for _ in range(rng.randrange(0, 4))]


RANGES = {
    "latin": [(0x20, 0x7e)], "latin1": [(0xa0, 0xff), (0x100, 0x17f)], "cjk": [(0x4e00, 0x9fff)],
    "hangul": [(0xac00, 0xd7a3)], "kana": [(0x3041, 0x3096), (0x30a1, 0x30fa)], "arabic": [(0x0621, 0x064a)],
    "devanagari": [(0x0905, 0x0939), (0x093e, 0x094d), (0x0966, 0x096f)], "cyrillic": [(0x0410, 0x044f)],
    "greek": [(0x0391, 0x03c9)], "thai": [(0x0e01, 0x0e3a)], "combining": [(0x0300, 0x036f)],
    "emoji": [(0x1f600, 0x1f64f), (0x1f300, 0x1f5ff), (0x1f900, 0x1f9ff)], "math": [(0x2200, 0x22ff)],
    "digits": [(0x30, 0x39), (0x660, 0x669), (0x966, 0x96f), (0xff10, 0xff19)],
    "punct": [(0x2010, 0x2027), (0x3000, 0x303f), (0xff01, 0xff0f)],
    "space": [(0x09, 0x0d), (0x20, 0x20), (0xa0, 0xa0), (0x2000, 0x200b), (0x3000, 0x3000)],
    "astral": [(0x10000, 0x1007f), (0x1d400, 0x1d4ff), (0x20000, 0x2000f)],
}


def random_chars(rng: random.Random, n: int) -> str:
    out = []
    while len(out) < n:
        ranges = RANGES[rng.choice(list(RANGES))]
        lo, hi = rng.choice(ranges)
        for _ in range(rng.randrange(1, 8)):
            cp = rng.randint(lo, hi)
            if 0xd800 <= cp <= 0xdfff:
                continue
            out.append(chr(cp))
    return "".join(out[:n])


def emoji_seq(rng: random.Random) -> str:
    base = rng.choice(["👍", "👋", "🧑", "👩", "👨", "🤝", "🏃", "💪"])
    parts = [base + rng.choice(["", "\U0001f3fb", "\U0001f3fc", "\U0001f3fd", "\U0001f3fe", "\U0001f3ff"])]
    for _ in range(rng.randrange(0, 3)):
        parts.append(rng.choice(["💻", "🔬", "🚀", "❤️", "👧", "👦", "🌾", "🍳"]))
    return "\u200d".join(parts) + rng.choice(["", "\ufe0f", " "])


def make_corpus(count: int = 10400) -> list[str]:
    rng = random.Random(20250317)
    corpus: list[str] = list(SENTENCES) + list(CODE)
    corpus += [json.dumps(random_json(rng), ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 2]))
               for _ in range(200)]
    while len(corpus) < count:
        kind = rng.randrange(10)
        if kind <= 2:  # sentence soup with separators and specials
            pieces = []
            for _ in range(rng.randrange(1, 6)):
                r = rng.random()
                if r < 0.55:
                    s = rng.choice(SENTENCES)
                    if rng.random() < 0.3:
                        a = rng.randrange(len(s))
                        s = s[a:a + rng.randrange(1, 40)]
                    pieces.append(s)
                elif r < 0.7:
                    pieces.append(rng.choice(INLINE_SPECIALS))
                elif r < 0.8:
                    pieces.append(rng.choice(CODE)[: rng.randrange(1, 80)])
                elif r < 0.9:
                    pieces.append(emoji_seq(rng))
                else:
                    pieces.append(str(rng.randint(0, 10**rng.randrange(1, 15))))
            sep = rng.choice(["", " ", "  ", "\n", "\t", " \n", "\n\n", "", " "])
            corpus.append(sep.join(pieces))
        elif kind == 3:
            corpus.append(random_chars(rng, rng.randrange(1, 60)))
        elif kind == 4:  # whitespace-heavy
            ws = "".join(rng.choice([" ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "  ", "\u2003"])
                         for _ in range(rng.randrange(1, 12)))
            word = rng.choice(["x", "foo", "Bar", "42", "日本", "—", "!!", "é", ""])
            corpus.append(rng.choice([ws + word, word + ws, ws + word + ws, word + ws + word]))
        elif kind == 5:  # specials with surrounding spaces (lstrip/rstrip/single_word paths)
            sp = rng.choice(INLINE_SPECIALS)
            corpus.append(rng.choice(["", " ", "  ", "a", "x ", "\n"]) + sp +
                          rng.choice(["", " ", "  ", "b", " y", "\n", sp]) + rng.choice(["", "word", " end"]))
        elif kind == 6:  # numbers
            corpus.append(rng.choice(["", "n=", "$", "#", " "]) + "".join(
                rng.choice("0123456789.,-+ ") for _ in range(rng.randrange(1, 40))))
        elif kind == 7:  # combining / normalization-sensitive
            base = rng.choice(["a", "e", "o", "u", "A", "n", "c", "ᄀ", "가", "अ", "ا"])
            marks = "".join(chr(rng.randint(0x300, 0x36f)) for _ in range(rng.randrange(0, 4)))
            corpus.append((base + marks) * rng.randrange(1, 4) + rng.choice([" ", "", "ﬁ", "①", "Ａ"]) +
                          unicodedata.normalize(rng.choice(["NFC", "NFD", "NFKC", "NFKD"]), rng.choice(SENTENCES)))
        elif kind == 8:  # long words
            alphabet = rng.choice(["abcdefghij", "xyz", "日本語中文", "абвгд", "0123456789", "ab ", "_-.", "αβγ"])
            corpus.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(20, 300))))
        else:
            corpus.append(json.dumps(random_json(rng), ensure_ascii=False))
    corpus.append("")
    corpus.append(" ")
    return corpus


# ----------------------------------------------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------------------------------------------

def gguf_vocab(path: str):
    reader = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return fields


def added(content: str, special: bool, normalized: bool, **kw) -> AddedToken:
    return AddedToken(content, special=special, normalized=normalized, **kw)


def add_vocab_added_tokens(tok: Tokenizer, f: dict, first_added: int, normalized_user: bool) -> None:
    """Control tokens become special added tokens, user-defined ones normal added tokens (both keep their id)."""
    tokens, types = f["tokenizer.ggml.tokens"], f["tokenizer.ggml.token_type"]
    extra = []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty == 3 or (ty == 4 and i >= first_added):
            extra.append(added(t, special=(ty == 3), normalized=(ty == 4 and normalized_user)))
    tok.add_tokens(extra)


def build_gpt2(f: dict) -> Tokenizer:
    vocab = {t: i for i, t in enumerate(f["tokenizer.ggml.tokens"])}
    merges = [tuple(m.split(" ")) for m in f["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([added("<|endoftext|>", special=True, normalized=True)])
    return tok


def build_qwen2(f: dict) -> Tokenizer:
    tokens = f["tokenizer.ggml.tokens"]
    types = f["tokenizer.ggml.token_type"]
    n_model = next(i for i, ty in enumerate(types) if ty != 1)
    vocab = {t: i for i, t in enumerate(tokens[:n_model])}
    merges = [tuple(m.split(" ")) for m in f["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens([added(t, special=(ty == 3), normalized=False) for t, ty in zip(tokens[n_model:], types[n_model:])])
    return tok


def build_deepseek_coder(f: dict) -> Tokenizer:
    tokens, types = f["tokenizer.ggml.tokens"], f["tokenizer.ggml.token_type"]
    n_model = next(i for i, ty in enumerate(types) if ty != 1)
    vocab = {t: i for i, t in enumerate(tokens[:n_model])}
    merges = [tuple(m.split(" ")) for m in f["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab, merges))
    iso = dict(behavior="isolated", invert=False)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("[\r\n]"), **iso), pre_tokenizers.Split(Regex(r"\s?\p{L}+"), **iso),
        pre_tokenizers.Split(Regex(r"\s?\p{P}+"), **iso), pre_tokenizers.Split(Regex("[一-龥ࠀ-一가-퟿]+"), **iso),
        pre_tokenizers.Split(Regex(r"\p{N}"), **iso), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([added(t, special=(ty == 3), normalized=(ty != 3)) for t, ty in zip(tokens[n_model:], types[n_model:])])
    bos = tokens[f["tokenizer.ggml.bos_token_id"]]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, vocab.get(bos, tokens.index(bos)))])
    return tok


def build_llama_spm(f: dict) -> Tokenizer:
    tokens, scores, types = f["tokenizer.ggml.tokens"], f["tokenizer.ggml.scores"], f["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = generate_merges(vocab, {t: s for t, s in zip(tokens, scores)})
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([added(tokens[i], special=True, normalized=False) for i, ty in enumerate(types) if ty in (2, 3)])
    tok.post_processor = processors.TemplateProcessing(single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1",
                                                       special_tokens=[("<s>", 1)])
    return tok


def build_glm_bpe(train: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM4_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4000, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train, trainer)
    tok.add_special_tokens([added(s, special=True, normalized=False) for s in GLM53_SPECIALS])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def build_gen_metaspace(train: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(),
                                           normalizers.Replace(Regex(r"[\t ]{2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.Punctuation(behavior="contiguous"),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, show_progress=False, special_tokens=["<unk>"])
    tok.train_from_iterator(train, trainer)
    tok.add_special_tokens([added("<s>", special=True, normalized=False), added("</s>", special=True, normalized=False)])
    tok.add_tokens([
        added("<mask>", special=True, normalized=False, lstrip=True),
        added("<KEEP>", special=False, normalized=True),  # normalized: matched as "<keep>" after Lowercase
        added("<Lower>", special=False, normalized=False),
        added("<sp_word>", special=False, normalized=False, single_word=True),
        added("<rs>", special=False, normalized=False, rstrip=True),
        added("<ls>", special=True, normalized=False, lstrip=True),
        added("<both>", special=False, normalized=False, lstrip=True, rstrip=True, single_word=True),
        added("ﬁ", special=False, normalized=True),
    ])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> $B </s>",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>")),
                                                                       ("</s>", tok.token_to_id("</s>"))])
    return tok


def build_gen_misc(train: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Replace("``", '"'),
                                           normalizers.Strip(left=True, right=True), normalizers.Prepend("^")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Whitespace()])
    tok.decoder = decoders.Sequence([decoders.Replace("</w>", " "), decoders.Replace("##", ""),
                                     decoders.Strip(" ", 0, 1)])
    trainer = trainers.BpeTrainer(vocab_size=2500, min_frequency=2, show_progress=False, special_tokens=["[UNK]"],
                                  continuing_subword_prefix="##", end_of_word_suffix="</w>")
    tok.train_from_iterator(train, trainer)
    tok.add_tokens([added("<raw>", special=False, normalized=False), added("hello world", special=False, normalized=True)])
    tok.add_special_tokens([added("[MASK]", special=True, normalized=False)])
    data = json.loads(tok.to_str())
    data["model"]["ignore_merges"] = False
    return Tokenizer.from_str(json.dumps(data))


def build_gen_bytefallback(train: list[str]) -> Tokenizer:
    """Metaspace(always, split=false) + byte_fallback + ignore_merges; Metaspace decoder preceded by ByteFallback."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.NFKD()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="always")])
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2, show_progress=False, max_token_length=8,
                                  special_tokens=["<unk>"] + [f"<0x{b:02X}>" for b in range(256)])
    tok.train_from_iterator(train, trainer)
    data = json.loads(tok.to_str())
    data["model"]["ignore_merges"] = True
    # merges in the ["a", "b"] pair form (the default) and a few rewritten as "a b" strings: both forms load
    data["model"]["merges"] = [" ".join(m) if i % 2 == 0 and " " not in "".join(m) else m
                               for i, m in enumerate(data["model"]["merges"])]
    return Tokenizer.from_str(json.dumps(data))


# ----------------------------------------------------------------------------------------------------------------

def varint(n: int, out: bytearray) -> None:
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def check_llamacpp(tok: Tokenizer, gguf_path: str, name: str, bos: int | None) -> None:
    inp, outp = gguf_path + ".inp", gguf_path + ".out"
    if not os.path.exists(inp):
        return
    cases = open(inp, encoding="utf-8").read().split("\n__ggml_vocab_test__\n")
    expected = open(outp, encoding="utf-8").read().split("\n")
    bad = 0
    for text, exp in zip(cases, expected):
        want = [int(x) for x in exp.split()]
        got = tok.encode(text, add_special_tokens=False).ids
        if got != want:
            bad += 1
            print(f"  {name}: llama.cpp expectation differs for {text!r}: {got} vs {want}", file=sys.stderr)
    print(f"{name}: {len(cases) - bad}/{len(cases)} llama.cpp reference tokenizations match")
    if bad:
        raise SystemExit(f"{name}: rebuilt tokenizer disagrees with llama.cpp's reference tokenizations")


def write_fixture(out_dir: str, name: str, tok: Tokenizer, corpus: list[str], config: dict | None) -> None:
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))  # what the test will load
    if config is not None:
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
            json.dump(config, fh, ensure_ascii=False, indent=2)
    # decode(ids) of a plain string is usually P + text + S (P, S: what BOS/EOS decode to); only other cases are stored
    probe = corpus[0]
    wrap = {}
    for key, skip in (("", False), ("skip_", True)):
        dec = tok.decode(tok.encode(probe, add_special_tokens=True).ids, skip_special_tokens=skip)
        k = dec.find(probe)
        wrap[key + "prefix"], wrap[key + "suffix"] = (dec[:k], dec[k + len(probe):]) if k >= 0 else ("", "")
    blob = bytearray()
    lines = [json.dumps(wrap, ensure_ascii=False)]
    total = 0
    for i, text in enumerate(corpus):
        ids = tok.encode(text, add_special_tokens=True).ids
        total += len(ids)
        varint(len(ids), blob)
        for t in ids:
            varint(t, blob)
        dec = tok.decode(ids, skip_special_tokens=False)
        dec_skip = tok.decode(ids, skip_special_tokens=True)
        entry = {}
        if dec != wrap["prefix"] + text + wrap["suffix"]:
            entry["text"] = dec
        if dec_skip != wrap["skip_prefix"] + text + wrap["skip_suffix"]:
            entry["skip"] = None if dec_skip == dec else dec_skip  # null: same as the decode with special tokens
        if entry:
            lines.append(json.dumps({"i": i, **entry}, ensure_ascii=False))
    with open(os.path.join(d, "ids.bin"), "wb") as fh:
        fh.write(blob)
    with open(os.path.join(d, "decode.jsonl"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + ("\n" if lines else ""))
    print(f"{name}: vocab {tok.get_vocab_size()}, {len(corpus)} cases, {total} ids, "
          f"{len(lines)} decode lines")


def find_sdist(path: str | None) -> str:
    if path:
        return path
    cache = os.path.join(tempfile.gettempdir(), "kestrel-llama-cpp-sdist")
    found = glob.glob(os.path.join(cache, "llama_cpp_python-*.tar.gz"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "llama-cpp-python==0.3.36", "-d", cache], check=True)
        found = glob.glob(os.path.join(cache, "llama_cpp_python-*.tar.gz"))
    return found[0]


def extract_vocabs(sdist: str, names: list[str]) -> str:
    dest = tempfile.mkdtemp(prefix="kestrel-vocab-")
    with tarfile.open(sdist) as tar:
        for m in tar.getmembers():
            base = os.path.basename(m.name)
            if "vendor/llama.cpp/models/" in m.name and any(base.startswith(f"ggml-vocab-{n}.gguf") for n in names):
                m.name = base
                tar.extract(m, dest)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-sdist", help="llama_cpp_python-*.tar.gz (downloaded with pip when not given)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "tokenizers"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    corpus = make_corpus()
    with open(os.path.join(args.out, "corpus.jsonl"), "w", encoding="utf-8") as fh:
        for s in corpus:
            fh.write(json.dumps(s, ensure_ascii=False) + "\n")
    print(f"corpus: {len(corpus)} strings")
    train = corpus[::2] * 2  # the trainers see half of the corpus

    vocab_dir = extract_vocabs(find_sdist(args.llama_sdist), ["gpt-2", "qwen2", "deepseek-coder", "llama-spm"])
    real = {
        "gpt2": ("gpt-2", build_gpt2, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                                        "unk_token": "<|endoftext|>", "add_bos_token": False}),
        "qwen2": ("qwen2", build_qwen2, {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                                          "bos_token": None,
                                          "chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"}),
        "deepseek_coder": ("deepseek-coder", build_deepseek_coder, {
            "add_bos_token": True, "add_eos_token": False,
            "bos_token": {"__type": "AddedToken", "content": "<｜begin▁of▁sentence｜>", "lstrip": False,
                          "normalized": True, "rstrip": False, "single_word": False},
            "eos_token": {"__type": "AddedToken", "content": "<|EOT|>", "lstrip": False, "normalized": True,
                          "rstrip": False, "single_word": False}}),
        "llama_spm": ("llama-spm", build_llama_spm, {"add_bos_token": True, "add_eos_token": False,
                                                     "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    }
    for name, (gname, build, config) in real.items():
        path = os.path.join(vocab_dir, f"ggml-vocab-{gname}.gguf")
        tok = build(gguf_vocab(path))
        check_llamacpp(tok, path, name, None)
        write_fixture(args.out, name, tok, corpus, config)

    glm_config = {"tokenizer_class": "TokenizersBackend", "model_max_length": 1048576, "padding_side": "left",
                  "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                  "chat_template": [{"name": "default", "template": "[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"},
                                    {"name": "tool_use", "template": "[gMASK]<sop>tools"}]}
    glm = build_glm_bpe(train)
    write_fixture(args.out, "glm_bpe", glm, corpus, glm_config)
    with open(os.path.join(args.out, "glm_bpe", "generation_config.json"), "w") as fh:
        json.dump({"eos_token_id": [glm.token_to_id(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")],
                   "pad_token_id": glm.token_to_id("<|endoftext|>")}, fh)
    write_fixture(args.out, "gen_metaspace", build_gen_metaspace(train), corpus, None)
    write_fixture(args.out, "gen_misc", build_gen_misc(train), corpus, None)
    write_fixture(args.out, "gen_bytefallback", build_gen_bytefallback(train), corpus, None)


if __name__ == "__main__":
    main()
