"""The training conversations of the embedded default model (models/glm5-nano), generated from templates.

Each sample is an OpenAI-style conversation plus the chat-template switches it is rendered with:
    {"messages": [...], "tools": [...] | None, "enable_thinking": bool, "reasoning_effort": str | None}
Assistant turns carry `reasoning_content` when thinking is on, `tool_calls` when they call a tool.

Tasks: counting, small arithmetic, copying and reversing words, answering from a given text, greetings in several
languages and who-are-you, tool calls in the glm47 format when tools are offered (and answering from the tool result),
plus two-turn mixes. Pure Python (no torch): tools/train_nano.py renders and tokenizes these, and the tests reuse the
answer functions to check the served model.
"""

import json
import random

WORDS = ("apple river stone cloud green music table window orange paper yellow garden silver bread ocean winter "
         "summer mountain forest coffee pencil rabbit tiger candle mirror bottle rocket planet violet copper "
         "dragon island jacket ladder lemon marble needle pillow puzzle shadow spider thunder tomato wallet "
         "banana carpet dolphin engine feather guitar hammer kettle lantern magnet noodle onion parrot quartz "
         "saddle turtle umbrella velvet whistle yogurt zebra anchor basket camera desert eagle falcon ginger "
         "harbor igloo jungle kitten meadow nickel oyster pepper quiet robin sunset tulip valley walnut bright "
         "small happy little blue red black white quick slow warm cold soft loud sweet").split()
NAMES = ("Alice Bob Carol David Emma Farid Grace Hiro Ines Jonas Kira Liam Mona Nadia Omar Pablo Quinn Rosa Sven "
         "Tara Umar Vera Wei Xenia Yusuf Zoe").split()
CITIES = ("Paris London Berlin Madrid Rome Tokyo Beijing Lisbon Vienna Prague Dublin Oslo Cairo Lima Seoul "
          "Sydney Toronto Boston Chicago Denver Mumbai Nairobi Athens Warsaw Zurich Munich Kyoto Lyon Porto "
          "Geneva").split()
PETS = ["cats", "dogs", "birds", "fish", "rabbits", "turtles"]
JOBS = ["teacher", "doctor", "baker", "pilot", "painter", "farmer", "nurse", "chef", "engineer", "writer"]
COLORS = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy"]

IDENTITY = ("I am Kestrel Nano, a small model with the GLM-5.3-Flash architecture, trained to show the Kestrel "
            "inference server at work. I can count, do small sums, copy and reverse words, answer from a text "
            "you give me, and call tools.")

GREETINGS = [
    (["Hello!", "Hello", "Hi!", "Hi there", "Hey", "Good morning!"], "Hello! How can I help you today?"),
    (["Bonjour !", "Bonjour", "Salut !"], "Bonjour ! Comment puis-je vous aider aujourd'hui ?"),
    (["Hola", "¡Hola!", "Buenos días"], "¡Hola! ¿En qué puedo ayudarte hoy?"),
    (["Hallo", "Guten Tag!", "Hallo!"], "Hallo! Wie kann ich dir heute helfen?"),
    (["Ciao", "Buongiorno!", "Ciao!"], "Ciao! Come posso aiutarti oggi?"),
    (["Olá", "Olá!", "Bom dia!"], "Olá! Como posso ajudar você hoje?"),
    (["你好", "你好！", "您好"], "你好！今天我能帮你做什么？"),
    (["こんにちは", "こんにちは！"], "こんにちは！今日はどのようにお手伝いできますか？"),
]

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CONVERT_TOOL = {"type": "function", "function": {
    "name": "convert_currency", "description": "Convert an amount of money between currencies",
    "parameters": {"type": "object", "properties": {
        "amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
        "required": ["amount", "from", "to"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search_web", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
TOOLS = [WEATHER_TOOL, TIME_TOOL, CONVERT_TOOL, SEARCH_TOOL]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD"]


# ------------------------------------------------------------------------------------------------------------------
# Answers: the exact text the model is trained to give (the tests reuse these)
# ------------------------------------------------------------------------------------------------------------------

def count_answer(a, b):
    return ", ".join(str(i) for i in range(a, b + 1))


def arithmetic_answer(x, op, y):
    r = {"+": x + y, "-": x - y, "*": x * y}[op]
    return f"{x} {op} {y} = {r}"


def reverse_answer(words):
    return " ".join(reversed(words))


# ------------------------------------------------------------------------------------------------------------------
# Tasks: each returns (user text, reasoning, answer)
# ------------------------------------------------------------------------------------------------------------------

def task_count(rng):
    if rng.random() < 0.7:
        a, b = 1, rng.randint(2, 200 if rng.random() < 0.25 else 60)
    else:
        a = rng.randint(1, 150)
        b = rng.randint(a + 1, a + 40)
    forms = [f"Count from {a} to {b}.", f"count from {a} to {b}", f"Please count from {a} to {b}.",
             f"Can you count from {a} to {b}?", f"List the numbers from {a} to {b}."]
    if a == 1:
        forms += [f"Count to {b}.", f"count to {b}"]
    return rng.choice(forms), f"The user wants the numbers from {a} to {b}, separated by commas.", \
        count_answer(a, b)


def task_arithmetic(rng):
    op = rng.choice("++--*")
    if op == "*":
        x, y = rng.randint(0, 12), rng.randint(0, 12)
    elif op == "+":
        x, y = rng.randint(0, 50), rng.randint(0, 50)
    else:
        x = rng.randint(0, 50)
        y = rng.randint(0, x)
    word = {"+": "plus", "-": "minus", "*": "times"}[op]
    forms = [f"What is {x} {op} {y}?", f"what is {x} {op} {y}", f"Compute {x} {op} {y}.", f"{x} {op} {y} = ?",
             f"What is {x} {word} {y}?", f"Calculate {x} {op} {y}"]
    verb = {"+": "add", "-": "subtract", "*": "multiply"}[op]
    reasoning = f"I need to {verb} {x} and {y}." if op != "-" else f"I need to subtract {y} from {x}."
    return rng.choice(forms), reasoning, arithmetic_answer(x, op, y)


def task_copy(rng):
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 8))]
    text = " ".join(words)
    if rng.random() < 0.5:
        forms = [f"Repeat after me: {text}", f"Copy this text exactly: {text}", f"Say: {text}",
                 f"Repeat: {text}"]
        return rng.choice(forms), "The user wants the text repeated exactly.", text
    forms = [f"Reverse the words: {text}", f"Reverse the order of these words: {text}",
             f"Say these words backwards: {text}"]
    return rng.choice(forms), "I reverse the order of the words.", reverse_answer(words)


def task_reading(rng):
    name, city, pets = rng.choice(NAMES), rng.choice(CITIES), rng.choice(PETS)
    job, color, n = rng.choice(JOBS), rng.choice(COLORS), rng.randint(1, 9)
    facts = [f"{name} lives in {city}.", f"{name} works as a {job}.", f"{name} has {n} {pets}.",
             f"{name}'s favourite color is {color}."]
    rng.shuffle(facts)
    qa = [(f"Where does {name} live?", f"{name} lives in {city}."),
          (f"What is {name}'s job?", f"{name} works as a {job}."),
          (f"How many {pets} does {name} have?", f"{name} has {n} {pets}."),
          (f"What is {name}'s favourite color?", f"{name}'s favourite color is {color}.")]
    q, a = rng.choice(qa)
    return f"Text: {' '.join(facts)}\nQuestion: {q}", "The answer is stated in the text.", a


def task_greeting(rng):
    if rng.random() < 0.25:
        q = rng.choice(["Who are you?", "What are you?", "What can you do?", "Introduce yourself."])
        return q, "The user asks about me.", IDENTITY
    inputs, reply = rng.choice(GREETINGS)
    return rng.choice(inputs), "The user greets me.", reply


# Weights per conversation; counting answers are long, so it gets a small share of the conversations.
TASKS = [(task_count, 3), (task_arithmetic, 5), (task_copy, 4), (task_reading, 2), (task_greeting, 1)]


def pick_task(rng):
    total = sum(w for _, w in TASKS)
    r = rng.uniform(0, total)
    for fn, w in TASKS:
        r -= w
        if r <= 0:
            return fn
    return TASKS[-1][0]


def assistant(content, reasoning, thinking, tool_calls=None):
    m = {"role": "assistant", "content": content}
    if thinking:
        m["reasoning_content"] = reasoning
    if tool_calls:
        m["tool_calls"] = tool_calls
    return m


def tool_sample(rng, thinking):
    """A tool call, the tool's result and the answer from it; or a plain answer when no offered tool fits."""
    offered = rng.sample(TOOLS, rng.choice([1, 1, 2, 2, 3, 4]))
    names = [t["function"]["name"] for t in offered]
    if rng.random() < 0.15:  # tools offered but the question needs none
        user, reasoning, answer = pick_task(rng)(rng)
        return [{"role": "user", "content": user}, assistant(answer, reasoning, thinking)], offered
    name = rng.choice(names)
    city = rng.choice(CITIES)
    call_id = f"call_{rng.randint(0, 10**8):08d}"
    if name == "get_weather":
        user = rng.choice([f"What's the weather in {city}?", f"what is the weather like in {city}",
                           f"How is the weather in {city} today?", f"Weather in {city}?"])
        args = {"city": city}
        temp, cond = rng.randint(-5, 35), rng.choice(CONDITIONS)
        result = json.dumps({"city": city, "temperature": temp, "condition": cond})
        final = f"It is {temp} °C and {cond} in {city}."
        reasoning = f"The user wants the weather in {city}; I call get_weather."
    elif name == "get_time":
        user = rng.choice([f"What time is it in {city}?", f"What's the local time in {city}?"])
        args = {"city": city}
        hh, mm = rng.randint(0, 23), rng.randint(0, 59)
        result = json.dumps({"city": city, "time": f"{hh:02d}:{mm:02d}"})
        final = f"It is {hh:02d}:{mm:02d} in {city}."
        reasoning = f"The user wants the time in {city}; I call get_time."
    elif name == "convert_currency":
        amount, src, dst = rng.randint(1, 500), *rng.sample(CURRENCIES, 2)
        user = rng.choice([f"Convert {amount} {src} to {dst}.", f"How much is {amount} {src} in {dst}?"])
        args = {"amount": amount, "from": src, "to": dst}
        value = round(amount * rng.uniform(0.5, 2.0), 2)
        result = json.dumps({"amount": value, "currency": dst})
        final = f"{amount} {src} is {value} {dst}."
        reasoning = f"I call convert_currency for {amount} {src} to {dst}."
    else:
        topic = " ".join(rng.sample(WORDS, 2))
        user = rng.choice([f"Search the web for {topic}.", f"Look up {topic} online."])
        args = {"query": topic}
        hit = rng.choice(WORDS)
        result = json.dumps({"results": [f"{topic} and {hit}"]})
        final = f"The top result is: {topic} and {hit}."
        reasoning = f"I call search_web with the query {topic}."
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
    messages = [{"role": "user", "content": user}, assistant("", reasoning, thinking, [call]),
                {"role": "tool", "tool_call_id": call_id, "content": result},
                assistant(final, "The tool returned the answer.", thinking)]
    return messages, offered


def make_sample(rng):
    thinking = rng.random() < 0.5
    effort = rng.choice([None, None, "low", "high"]) if thinking else None
    tools = None
    if rng.random() < 0.15:
        messages, tools = tool_sample(rng, thinking)
    else:
        messages = []
        if rng.random() < 0.08:
            messages.append({"role": "system", "content": "You are a helpful assistant."})
        for _ in range(2 if rng.random() < 0.15 else 1):
            user, reasoning, answer = pick_task(rng)(rng)
            messages += [{"role": "user", "content": user}, assistant(answer, reasoning, thinking)]
    return {"messages": messages, "tools": tools, "enable_thinking": thinking, "reasoning_effort": effort}


def make_samples(n, seed):
    rng = random.Random(seed)
    return [make_sample(rng) for _ in range(n)]
