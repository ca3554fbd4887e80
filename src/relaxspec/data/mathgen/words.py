"""Vocabulary tables of the story families: names, items, verbs, rates, shop items, distractors
(the original generator's, then the broadened generator's additions)."""

from __future__ import annotations

NAMES = [
    "Lena",
    "Omar",
    "Priya",
    "Jonas",
    "Mia",
    "Kofi",
    "Sofia",
    "Diego",
    "Hana",
    "Lucas",
    "Amara",
    "Ivan",
    "Chloe",
    "Ravi",
    "Nora",
    "Mateo",
    "Yuki",
    "Ben",
    "Zara",
    "Tom",
    "Elif",
    "Sam",
    "Aisha",
    "Felix",
    "Grace",
    "Hugo",
    "Ines",
    "Jamal",
    "Kira",
    "Leo",
    "Maya",
    "Noah",
    "Olga",
    "Pablo",
    "Rosa",
    "Theo",
    "Uma",
    "Victor",
    "Wendy",
    "Ali",
]

# (singular, plural, container, container plural)
ITEMS = [
    ("apple", "apples", "basket", "baskets"),
    ("marble", "marbles", "jar", "jars"),
    ("sticker", "stickers", "sheet", "sheets"),
    ("shell", "shells", "bag", "bags"),
    ("card", "cards", "pack", "packs"),
    ("pencil", "pencils", "box", "boxes"),
    ("cookie", "cookies", "tray", "trays"),
    ("stamp", "stamps", "album", "albums"),
    ("bead", "beads", "string", "strings"),
    ("egg", "eggs", "carton", "cartons"),
    ("book", "books", "shelf", "shelves"),
    ("flower", "flowers", "bunch", "bunches"),
    ("brick", "bricks", "pallet", "pallets"),
    ("candle", "candles", "crate", "crates"),
    ("seed", "seeds", "packet", "packets"),
    ("coin", "coins", "pouch", "pouches"),
]

GAIN_VERBS = ["finds", "gets", "receives", "is given", "collects", "picks up"]
LOSS_VERBS = ["gives away", "loses", "uses", "sells", "donates", "trades away"]
BUY_VERBS = ["buys", "orders", "brings home", "picks up"]

# (thing made, unit of work, maker)
RATES = [
    ("bolts", "hour", "machine"),
    ("pages", "day", "printer"),
    ("loaves", "hour", "bakery"),
    ("bottles", "minute", "filling line"),
    ("bricks", "day", "crew"),
    ("shirts", "hour", "workshop"),
    ("toys", "shift", "factory"),
    ("letters", "hour", "clerk"),
]

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

# (item, plural) bought in a shop, and a plausible unit price range
SHOP_ITEMS = [
    ("notebook", "notebooks", 2, 15),
    ("pen", "pens", 1, 9),
    ("sandwich", "sandwiches", 3, 12),
    ("ticket", "tickets", 5, 40),
    ("plant", "plants", 4, 30),
    ("shirt", "shirts", 8, 45),
    ("lamp", "lamps", 10, 80),
    ("puzzle", "puzzles", 6, 25),
    ("ball", "balls", 2, 20),
    ("mug", "mugs", 3, 18),
]
CURRENCIES = ["dollars", "euros", "pounds", "coins"]

DISTRACTORS = [
    "{other} is {n} years old.",
    "The shop is {n} meters from the school.",
    "{other} has read {n} pages of a novel.",
    "It is {n} degrees outside.",
    "The bus ride takes {n} minutes.",
    "{other} owns {n} comic books, but they do not matter here.",
    "There are {n} chairs in the hall.",
]

MULTIPLIER_WORDS = {2: "twice", 3: "three times", 4: "four times", 5: "five times"}


MORE_NAMES = [
    "Adam", "Bea", "Carlos", "Dana", "Emeka", "Fatima", "Gus", "Hiro", "Isla", "Jin", "Kemal",
    "Lara", "Milo", "Nadia", "Oscar", "Paula", "Quinn", "Rhea", "Sven", "Tara", "Ugo", "Vera",
    "Will", "Xena", "Yara", "Zeke",
]  # fmt: skip
ALL_NAMES = NAMES + MORE_NAMES

# (singular, plural): the original items plus new ones
OBJECTS = [(s, p) for s, p, _, _ in ITEMS] + [
    ("balloon", "balloons"), ("button", "buttons"), ("crayon", "crayons"), ("cupcake", "cupcakes"),
    ("feather", "feathers"), ("pebble", "pebbles"), ("muffin", "muffins"), ("comic", "comics"),
    ("ribbon", "ribbons"), ("orange", "oranges"), ("toy car", "toy cars"), ("postcard", "postcards"),
    ("paper clip", "paper clips"), ("sock", "socks"), ("acorn", "acorns"), ("magnet", "magnets"),
]  # fmt: skip
MORE_GAIN_VERBS = [*GAIN_VERBS, "wins", "buys", "gathers", "is handed", "earns"]
MORE_LOSS_VERBS = [*LOSS_VERBS, "eats", "breaks", "misplaces", "hands out", "throws away"]
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh"]
MORE_DISTRACTORS = [
    *DISTRACTORS,
    "{other} painted the fence {n} days ago.",
    "The library has {n} tables.",
    "{other} lives {n} kilometers away.",
    "A film lasts {n} minutes.",
]
