"""The embedded probabilistic English grammar: the default corpus and a source of tasks.

It exists so that a fresh machine can pretrain with no downloads, and so that compositional
tasks (semantic parsing, active->passive, probing) can be built with full control over
which words and structures are seen in training. Pure Python + NumPy.

A sentence is generated as a small tree (`Clause`, `NP`, `PP`) and then realized into a
`Sentence`: tokens, one grammatical role per token, features and a logical form.

Grammar (active voice, present or past tense, subject-verb agreement)::

    S      -> CLAUSE "."
    CLAUSE -> NP_subj V_intr | NP_subj V_trans NP_obj | NP_subj V_cp "that" CLAUSE
    NP     -> name | Det (Adj) Noun (PP)          Det agrees with Noun in number
    PP     -> Prep NP                              (PP objects are inanimate nouns)

Roles (`ROLES`). Main-clause tokens get bare labels, tokens of an embedded clause (any
depth) the same label prefixed with ``cp_``. An NP in slot ``subj``/``obj``/``agent`` gives
``{slot}_det``, ``{slot}_adj``, ``{slot}_noun`` and, for every PP inside it however deeply
nested, ``{slot}_pp_prep``, ``{slot}_pp_det``, ``{slot}_pp_adj``, ``{slot}_pp_noun``.
Clause-level labels: ``verb`` (main verb; the participle in a passive), ``comp`` (the
complementizer "that"), ``aux`` ("was"/"is"... of a passive), ``by`` (passive agent marker),
``punct`` (final "."). ``agent_*``, ``aux`` and ``by`` only arise from `to_passive`.

Logical form (COGS variable-free style, one space between all symbols)::

    a cat saw the dog on the mat .
    see ( agent = cat , theme = * dog ( nmod . on = * mat ) )

A predicate is the verb lemma with its arguments in a fixed order: ``agent``, ``theme``,
``ccomp`` (a nested predicate). Unergative and clausal verbs take an agent subject,
unaccusative ones a theme subject. An NP is its noun lemma (or name), preceded by ``*``
when its determiner is definite (the, this, my, these...), followed by its modifiers in
parentheses: ``amod = ADJ`` then ``nmod . PREP = NP``. Like COGS-vf the LF records
predicate-argument structure and definiteness, not tense, number or which determiner,
so the active and passive of a sentence share one LF.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np

# ---------------------------------------------------------------------------------------
# Lexicon. Every form is written out rather than derived by spelling rules, so that the
# tables can be checked by eye and tests can look forms up directly. Its size (~540 lemmas,
# ~1100 word forms) is set by the tokenizer: a SentencePiece unigram model with a hard
# vocabulary of 512 needs about that many distinct words (~700 pieces are then possible).

# Characters of the logical forms that plain sentences never contain. A tokenizer trained on the
# grammar corpus keeps them (train_tokenizer's required_chars), so semantic parsing targets
# encode without unk, as they would with a web-text vocabulary.
LF_SYMBOLS = "()*,="

_ANIMATE = """
cat cats  dog dogs  bird birds  horse horses  rabbit rabbits  mouse mice  child children
teacher teachers  student students  doctor doctors  farmer farmers  baker bakers
sailor sailors  soldier soldiers  king kings  queen queens  girl girls  boy boys
woman women  man men  lion lions  monkey monkeys  hedgehog hedgehogs  penguin penguins
wolf wolves  fox foxes  goose geese  friend friends  neighbor neighbors  artist artists
pilot pilots  nurse nurses  judge judges  chef chefs  poet poets  scientist scientists
tourist tourists  driver drivers  singer singers  clown clowns  giraffe giraffes
frog frogs  bear bears  duck ducks  owl owls  elephant elephants  uncle uncles
author authors  tiger tigers  zebra zebras  kitten kittens  puppy puppies  pony ponies
turtle turtles  spider spiders  squirrel squirrels  beaver beavers  camel camels
donkey donkeys  parrot parrots  dragon dragons  wizard wizards  prince princes
princess princesses  captain captains  dancer dancers  painter painters  lawyer lawyers
cousin cousins  sister sisters  brother brothers  mother mothers  father fathers
monster monsters  robot robots  ghost ghosts  pirate pirates  knight knights
detective detectives  gardener gardeners  hunter hunters  baby babies  chicken chickens
goat goats  kangaroo kangaroos  koala koalas  panda pandas  octopus octopuses
lobster lobsters  crab crabs  snail snails  worm worms  bee bees  eagle eagles
shark sharks  whale whales  dolphin dolphins  mayor mayors  coach coaches  actor actors
waiter waiters  tailor tailors  plumber plumbers  barber barbers  mechanic mechanics
professor professors  giant giants  fairy fairies  witch witches  hamster hamsters
lamb lambs
"""
_INANIMATE = """
mat mats  table tables  box boxes  chair chairs  bed beds  house houses  car cars
boat boats  tree trees  garden gardens  room rooms  bottle bottles  cup cups  book books
ball balls  cake cakes  cookie cookies  basket baskets  bag bags  shelf shelves
desk desks  stage stages  tent tents  truck trucks  bowl bowls  plate plates
pillow pillows  drawer drawers  jar jars  bench benches  lamp lamps  rock rocks  hat hats
shoe shoes  vase vases  window windows  cabinet cabinets  puddle puddles  apple apples
envelope envelopes  umbrella umbrellas  igloo igloos  sandwich sandwiches  donut donuts
crayon crayons  leaf leaves  knife knives  glass glasses  pencil pencils
blanket blankets  carpet carpets  bucket buckets  barrel barrels  candle candles
mirror mirrors  pot pots  spoon spoons  fork forks  ladder ladders  wagon wagons
sofa sofas  closet closets  oven ovens  pond ponds  lake lakes  hill hills  cave caves
castle castles  tower towers  bridge bridges  fence fences  wall walls  roof roofs
radio radios  piano pianos  guitar guitars  kite kites  balloon balloons  coin coins
key keys  rope ropes  ring rings  tray trays  crate crates  boot boots  sock socks
scarf scarves  coat coats  rug rugs  towel towels  napkin napkins  statue statues
trophy trophies  jacket jackets  helmet helmets  necklace necklaces  map maps
newspaper newspapers  letter letters  package packages  suitcase suitcases
backpack backpacks  wallet wallets  clock clocks  painting paintings  poster posters
cushion cushions  kettle kettles  teapot teapots  saucer saucers  cradle cradles
tub tubs  shed sheds  barn barns  garage garages  attic attics  porch porches
yard yards  pool pools  beach beaches  island islands  canoe canoes  raft rafts
sled sleds  tractor tractors  bicycle bicycles  rocket rockets  pebble pebbles
shell shells  feather feathers  flower flowers  bush bushes
"""


def _pairs(table: str) -> dict[str, str]:
    words = table.split()
    return dict(zip(words[0::2], words[1::2]))


_ANIMATE_PL = _pairs(_ANIMATE)
_INANIMATE_PL = _pairs(_INANIMATE)
NOUN_PLURAL: dict[str, str] = {**_ANIMATE_PL, **_INANIMATE_PL}  # singular -> plural
ANIMATE_NOUNS = tuple(_ANIMATE_PL)
INANIMATE_NOUNS = tuple(_INANIMATE_PL)
NAMES = tuple(
    "emma liam olivia noah ava mason sophia lucas mia ethan isabella oliver charlotte"
    " james amelia henry harper leo ella jack zoe max lily sam grace owen nora ben ruby"
    " finn hannah jacob chloe daniel lucy adam alice victor paula oscar".split()
)

# lemma -> (numbers it combines with, definite?, sampling weight). Weights keep "a"/"the"
# dominant, as in real text, while the rarer determiners add lexical variety.
_DETS = """
a sg indef 6      every sg indef 1    each sg indef 1     this sg def 1    that sg def 1
the sg,pl def 8   my sg,pl def 1      our sg,pl def 1     your sg,pl def 1 his sg,pl def 1
her sg,pl def 1   their sg,pl def 1   some pl indef 3     these pl def 1   those pl def 1
many pl indef 1   several pl indef 1  two pl indef 1      three pl indef 1
""".split()
DETERMINERS: dict[str, tuple[frozenset[str], bool, float]] = {
    det: (frozenset(nums.split(",")), definite == "def", float(weight))
    for det, nums, definite, weight in zip(*[iter(_DETS)] * 4)
}

PREPOSITIONS = tuple(
    "in on beside near under behind above inside below beneath around outside against"
    " underneath across upon".split()
)
ADJECTIVES = tuple(
    "big small red blue green old young happy sad tall tiny lazy clever quiet loud brave"
    " shy yellow purple angry orange empty heavy soft wooden shiny dirty gentle fierce"
    " proud silly curious sleepy hungry famous friendly grumpy fancy round striped golden"
    " ancient noisy polite wise strange bright dark dusty fluffy muddy sticky smooth"
    " rough cheerful nervous clumsy careful lucky tidy messy modern rusty cozy enormous"
    " gloomy".split()
)


def _verbs(table: str) -> dict[str, tuple[str, str, str]]:
    """'lemma 3sg past participle' lines -> {lemma: (3sg present, past, participle)}."""
    rows = [line.split() for line in table.strip().splitlines()]
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


_TRANSITIVE = _verbs("""
see sees saw seen
like likes liked liked
help helps helped helped
find finds found found
follow follows followed followed
chase chases chased chased
hold holds held held
touch touches touched touched
push pushes pushed pushed
pull pulls pulled pulled
carry carries carried carried
watch watches watched watched
admire admires admired admired
visit visits visited visited
greet greets greeted greeted
call calls called called
hug hugs hugged hugged
kick kicks kicked kicked
draw draws drew drawn
eat eats ate eaten
take takes took taken
paint paints painted painted
clean cleans cleaned cleaned
break breaks broke broken
roll rolls rolled rolled
throw throws threw thrown
catch catches caught caught
bring brings brought brought
lift lifts lifted lifted
hide hides hid hidden
feed feeds fed fed
bite bites bit bitten
sell sells sold sold
buy buys bought bought
wash washes washed washed
fix fixes fixed fixed
drop drops dropped dropped
keep keeps kept kept
love loves loved loved
tease teases teased teased
borrow borrows borrowed borrowed
cook cooks cooked cooked
crush crushes crushed crushed
scold scolds scolded scolded
praise praises praised praised
rescue rescues rescued rescued
protect protects protected protected
tickle tickles tickled tickled
squeeze squeezes squeezed squeezed
bake bakes baked baked
shake shakes shook shaken
steal steals stole stolen
build builds built built
bury buries buried buried
examine examines examined examined
poke pokes poked poked
invite invites invited invited
blame blames blamed blamed
forgive forgives forgave forgiven
ignore ignores ignored ignored
surprise surprises surprised surprised
trust trusts trusted trusted
grab grabs grabbed grabbed
drag drags dragged dragged
polish polishes polished polished
wrap wraps wrapped wrapped
deliver delivers delivered delivered
kiss kisses kissed kissed
pinch pinches pinched pinched
hire hires hired hired
rob robs robbed robbed
tow tows towed towed
scrub scrubs scrubbed scrubbed
stir stirs stirred stirred
swallow swallows swallowed swallowed
spot spots spotted spotted
comfort comforts comforted comforted
obey obeys obeyed obeyed
approach approaches approached approached
bother bothers bothered bothered
attack attacks attacked attacked
sniff sniffs sniffed sniffed
lick licks licked licked
""")
_UNERGATIVE = _verbs("""
sleep sleeps slept slept
smile smiles smiled smiled
laugh laughs laughed laughed
run runs ran run
walk walks walked walked
jump jumps jumped jumped
dance dances danced danced
sing sings sang sung
swim swims swam swum
cry cries cried cried
sneeze sneezes sneezed sneezed
cough coughs coughed coughed
yawn yawns yawned yawned
wait waits waited waited
shout shouts shouted shouted
giggle giggles giggled giggled
nod nods nodded nodded
wave waves waved waved
whistle whistles whistled whistled
snore snores snored snored
blink blinks blinked blinked
shiver shivers shivered shivered
wink winks winked winked
scream screams screamed screamed
sigh sighs sighed sighed
hop hops hopped hopped
crawl crawls crawled crawled
bark barks barked barked
""")
# break and roll also appear as transitive: the causative alternation, as in COGS.
_UNACCUSATIVE = _verbs("""
fall falls fell fallen
break breaks broke broken
roll rolls rolled rolled
melt melts melted melted
vanish vanishes vanished vanished
shatter shatters shattered shattered
freeze freezes froze frozen
float floats floated floated
sink sinks sank sunk
burn burns burned burned
disappear disappears disappeared disappeared
grow grows grew grown
shrink shrinks shrank shrunk
collapse collapses collapsed collapsed
dissolve dissolves dissolved dissolved
crumble crumbles crumbled crumbled
tumble tumbles tumbled tumbled
wobble wobbles wobbled wobbled
drift drifts drifted drifted
bounce bounces bounced bounced
""")
_CLAUSAL = _verbs("""
say says said said
believe believes believed believed
notice notices noticed noticed
know knows knew known
think thinks thought thought
hope hopes hoped hoped
hear hears heard heard
forget forgets forgot forgotten
remember remembers remembered remembered
claim claims claimed claimed
suspect suspects suspected suspected
imagine imagines imagined imagined
discover discovers discovered discovered
report reports reported reported
realize realizes realized realized
dream dreams dreamed dreamed
guess guesses guessed guessed
mention mentions mentioned mentioned
announce announces announced announced
insist insists insisted insisted
whisper whispers whispered whispered
explain explains explained explained
assume assumes assumed assumed
pretend pretends pretended pretended
expect expects expected expected
feel feels felt felt
predict predicts predicted predicted
deny denies denied denied
""")
VERB_FORMS: dict[str, tuple[str, str, str]] = {
    **_TRANSITIVE, **_UNERGATIVE, **_UNACCUSATIVE, **_CLAUSAL
}  # lemma -> (3sg present, past, past participle); the lemma is the plural present
TRANSITIVE_VERBS = tuple(_TRANSITIVE)
UNERGATIVE_VERBS = tuple(_UNERGATIVE)
UNACCUSATIVE_VERBS = tuple(_UNACCUSATIVE)
CLAUSAL_VERBS = tuple(_CLAUSAL)
# (tense, number) -> form of "be" in a passive
BE_FORMS = {("past", "sg"): "was", ("past", "pl"): "were", ("present", "sg"): "is",
       ("present", "pl"): "are"}

# ---------------------------------------------------------------------------------------
# Roles

_NP_PARTS = ("det", "adj", "noun", "pp_prep", "pp_det", "pp_adj", "pp_noun")


def _np_roles(slot: str) -> tuple[str, ...]:
    return tuple(f"{slot}_{part}" for part in _NP_PARTS)


_CLAUSE_ROLES = (*_np_roles("subj"), "verb", *_np_roles("obj"), "comp")
_PASSIVE_ROLES = ("aux", "by", *_np_roles("agent"))
ROLES: tuple[str, ...] = (
    *_CLAUSE_ROLES, *_PASSIVE_ROLES, "punct", *("cp_" + r for r in _CLAUSE_ROLES)
)
# Roles whose word generation draws from the lexicon, hence the ones `forbid` can name.
FORBIDDABLE_ROLES = frozenset(
    r for r in ROLES if r not in _PASSIVE_ROLES and r.removeprefix("cp_") not in ("comp", "punct")
)
_LEMMAS = frozenset(
    [*NOUN_PLURAL, *NAMES, *DETERMINERS, *PREPOSITIONS, *ADJECTIVES, *VERB_FORMS]
)

# ---------------------------------------------------------------------------------------
# Trees and sentences

Tense = Literal["past", "present"]
Number = Literal["sg", "pl"]


@dataclass(frozen=True)
class PP:
    prep: str
    np: NP


@dataclass(frozen=True)
class NP:
    """A proper name when `det` is None, otherwise Det (Adj) Noun (PP); `head` is a lemma."""

    head: str
    det: Optional[str] = None
    number: Number = "sg"
    adj: Optional[str] = None
    pp: Optional[PP] = None


@dataclass(frozen=True)
class Clause:
    """The verb frame follows from the arguments: `obj` -> transitive, `ccomp` -> clausal,
    neither -> intransitive (unergative or unaccusative by the verb's lexicon entry)."""

    verb: str
    tense: Tense
    subj: NP
    obj: Optional[NP] = None
    ccomp: Optional[Clause] = None


@dataclass(frozen=True)
class Sentence:
    words: tuple[str, ...]  # lowercase tokens, the final "." included
    roles: tuple[str, ...]  # one label of ROLES per token
    lemmas: tuple[str, ...]  # dictionary form per token ("saw" -> "see", "an" -> "a")
    tense: Tense  # of the main verb
    subj_number: Number
    obj_number: Optional[Number]  # None without a direct object (and in a passive)
    voice: Literal["active", "passive"]
    lf: str
    cp_depth: int  # number of nested embedded clauses
    pp_depth: int  # deepest PP nesting anywhere in the sentence
    tree: Clause = dataclasses.field(repr=False)

    @property
    def text(self) -> str:
        return " ".join(self.words)


def _pp_depth(np_: Optional[NP]) -> int:
    return 0 if np_ is None or np_.pp is None else 1 + _pp_depth(np_.pp.np)


def _clause_pp_depth(cl: Clause) -> int:
    inner = _clause_pp_depth(cl.ccomp) if cl.ccomp else 0
    return max(_pp_depth(cl.subj), _pp_depth(cl.obj), inner)


def _cp_depth(cl: Clause) -> int:
    return 0 if cl.ccomp is None else 1 + _cp_depth(cl.ccomp)


# Realization appends (word, role, lemma) triples to `out` and returns the LF.


def _realize_np(np_: NP, slot: str, out: list) -> str:
    if np_.det is None:
        out.append((np_.head, f"{slot}_noun", np_.head))
        return np_.head
    noun = np_.head if np_.number == "sg" else NOUN_PLURAL[np_.head]
    det = "an" if np_.det == "a" and (np_.adj or noun)[0] in "aeiou" else np_.det
    out.append((det, f"{slot}_det", np_.det))
    mods = []
    if np_.adj:
        out.append((np_.adj, f"{slot}_adj", np_.adj))
        mods.append(f"amod = {np_.adj}")
    out.append((noun, f"{slot}_noun", np_.head))
    if np_.pp:
        # A PP nested inside a PP keeps the same labels: the role says which clause
        # argument a token belongs to, pp_depth says how deep it is.
        pp_slot = slot if slot.endswith("_pp") else f"{slot}_pp"
        out.append((np_.pp.prep, f"{pp_slot}_prep", np_.pp.prep))
        mods.append(f"nmod . {np_.pp.prep} = {_realize_np(np_.pp.np, pp_slot, out)}")
    lf = ("* " if DETERMINERS[np_.det][1] else "") + np_.head
    return f"{lf} ( {' , '.join(mods)} )" if mods else lf


def _predicate(verb: str, args: list[tuple[str, str]]) -> str:
    return f"{verb} ( {' , '.join(f'{k} = {v}' for k, v in args)} )"


def _realize_clause(cl: Clause, prefix: str, out: list) -> str:
    subj = _realize_np(cl.subj, prefix + "subj", out)
    s3, past, _ = VERB_FORMS[cl.verb]
    form = past if cl.tense == "past" else (s3 if cl.subj.number == "sg" else cl.verb)
    out.append((form, prefix + "verb", cl.verb))
    if cl.obj is not None:
        obj = _realize_np(cl.obj, prefix + "obj", out)
        return _predicate(cl.verb, [("agent", subj), ("theme", obj)])
    if cl.ccomp is not None:
        out.append(("that", prefix + "comp", "that"))
        inner = _realize_clause(cl.ccomp, "cp_", out)
        return _predicate(cl.verb, [("agent", subj), ("ccomp", inner)])
    role = "theme" if cl.verb in _UNACCUSATIVE else "agent"
    return _predicate(cl.verb, [(role, subj)])


def realize(cl: Clause, voice: Literal["active", "passive"] = "active") -> Sentence:
    """The sentence of a tree, generated or hand-built (e.g.
    ``realize(Clause("see", "past", NP("cat", "a"), NP("dog", "the")))``; a hand-built tree is
    not checked against the grammar); any voice but "active" is the passive, which needs a
    direct object (`to_passive` checks it)."""
    out: list = []
    if voice == "active":
        lf = _realize_clause(cl, "", out)
        subj_number, obj_number = cl.subj.number, (cl.obj.number if cl.obj else None)
    else:
        theme = _realize_np(cl.obj, "subj", out)
        out.append((BE_FORMS[cl.tense, cl.obj.number], "aux", "be"))
        out.append((VERB_FORMS[cl.verb][2], "verb", cl.verb))
        out.append(("by", "by", "by"))
        agent = _realize_np(cl.subj, "agent", out)
        lf = _predicate(cl.verb, [("agent", agent), ("theme", theme)])
        subj_number, obj_number = cl.obj.number, None
    out.append((".", "punct", "."))
    words, roles, lemmas = zip(*out)
    return Sentence(words, roles, lemmas, cl.tense, subj_number, obj_number, voice, lf,
                    _cp_depth(cl), _clause_pp_depth(cl), cl)


def to_passive(sentence: Sentence) -> Optional[Sentence]:
    """The passive of the main clause ("the dog was seen by a cat ."), with the same LF;
    None when the main verb takes no direct object. A passive is returned unchanged."""
    if sentence.voice == "passive":
        return sentence
    if sentence.tree.obj is None:
        return None
    return realize(sentence.tree, "passive")


# ---------------------------------------------------------------------------------------
# Generation


@dataclass(frozen=True)
class GrammarConfig:
    """Generation knobs. Defaults suit a pretraining corpus.

    forbid: (lemma, role) pairs that generation never produces, for lexical generalization
    splits, e.g. {("hedgehog", "obj_noun")} keeps "hedgehog"/"hedgehogs" out of object
    position. A main-clause role also covers its ``cp_`` twin; a ``cp_`` role covers only
    embedded clauses. Roles must be in FORBIDDABLE_ROLES (passive-only roles are not: the
    generator writes active sentences).
    """

    max_pp_depth: int = 2  # PP nesting per NP; 0 disables PPs
    subj_pp: bool = True  # may subjects carry PPs (False: the COGS obj_pp -> subj_pp split)
    max_cp_depth: int = 2  # nested "that" clauses; 0 disables them
    p_pp: float = 0.25  # an NP gets a PP (at each nesting level while depth allows)
    p_cp: float = 0.2  # a clause takes a clausal verb (while depth allows)
    p_transitive: float = 0.6  # otherwise, transitive rather than intransitive
    p_name: float = 0.2  # a subject or object NP is a proper name
    p_adj: float = 0.15  # a common-noun NP gets an adjective
    p_plural: float = 0.35
    p_present: float = 0.5
    p_recur: float = 0.5  # in corpus(): an NP re-mentions one of the document's entities
    forbid: frozenset = frozenset()

    def __post_init__(self):
        for name in ("max_pp_depth", "max_cp_depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"GrammarConfig.{name} must be an int >= 0, got {value!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.startswith("p_") and not 0.0 <= value <= 1.0:
                raise ValueError(f"GrammarConfig.{f.name} must be in [0, 1], got {value!r}")
        object.__setattr__(self, "forbid", frozenset(self.forbid))
        for pair in self.forbid:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise ValueError(f"GrammarConfig.forbid: expected (lemma, role), got {pair!r}")
            lemma, role = pair
            if lemma not in _LEMMAS:
                raise ValueError(f"GrammarConfig.forbid: unknown lemma {lemma!r} (forbid "
                                 "names dictionary forms: 'cat', not 'cats'; 'see', not 'saw')")
            if role not in FORBIDDABLE_ROLES:
                raise ValueError(f"GrammarConfig.forbid: role {role!r} cannot be forbidden; "
                                 f"choose from {sorted(FORBIDDABLE_ROLES)}")


@dataclass(frozen=True)
class _Pool:
    items: tuple
    cum: tuple  # cumulative weights
    members: frozenset


_KINDS = {
    "animate": ANIMATE_NOUNS, "inanimate": INANIMATE_NOUNS,
    "noun": ANIMATE_NOUNS + INANIMATE_NOUNS, "name": NAMES,
    "adj": ADJECTIVES, "prep": PREPOSITIONS, "transitive": TRANSITIVE_VERBS,
    "intransitive": UNERGATIVE_VERBS + UNACCUSATIVE_VERBS, "clausal": CLAUSAL_VERBS,
    "det_sg": tuple(d for d, (nums, _, _) in DETERMINERS.items() if "sg" in nums),
    "det_pl": tuple(d for d, (nums, _, _) in DETERMINERS.items() if "pl" in nums),
}


@functools.lru_cache(maxsize=None)
def _pool(forbid: frozenset, role: str, kind: str) -> _Pool:
    """The lemmas of `kind` allowed at `role`, with their weights accumulated."""
    items = tuple(w for w in _KINDS[kind] if (w, role) not in forbid
                  and (w, role.removeprefix("cp_")) not in forbid)
    weights = [DETERMINERS[w][2] if kind.startswith("det") else 1.0 for w in items]
    return _Pool(items, tuple(np.cumsum(weights).tolist()), frozenset(items))


@dataclass
class _Entity:
    lemma: str
    number: Number
    is_name: bool
    mentioned: bool = False


class _Generator:
    def __init__(self, cfg: GrammarConfig, seed: int):
        self.cfg = cfg
        self._rng = np.random.default_rng(seed)
        self._buf: list[float] = []
        self._i = 0
        self.cast: Optional[list[_Entity]] = None  # the current document's, in corpus()

    def u(self) -> float:
        # Uniforms are fetched in blocks: one numpy call per draw would dominate the
        # generation time. The stream is identical to scalar draws, so output is a pure
        # function of the seed.
        if self._i == len(self._buf):
            self._buf, self._i = self._rng.random(4096).tolist(), 0
        self._i += 1
        return self._buf[self._i - 1]

    def pick(self, role: str, kind: str) -> str:
        pool = _pool(self.cfg.forbid, role, kind)
        if not pool.items:
            raise ValueError(f"GrammarConfig.forbid leaves no {kind} lemma for role {role!r}")
        i = bisect.bisect_right(pool.cum, self.u() * pool.cum[-1])
        return pool.items[min(i, len(pool.items) - 1)]

    def new_document(self) -> None:
        """Choose the document's entities. Their first mention is indefinite and later ones
        definite, so sentence order leaves a trace a model can learn (for SOP)."""
        kinds = ("animate", "animate", "name", "inanimate", "inanimate")
        self.cast = []
        for kind in kinds:
            lemma = _KINDS[kind][int(self.u() * len(_KINDS[kind]))]
            number = "pl" if kind != "name" and self.u() < self.cfg.p_plural else "sg"
            self.cast.append(_Entity(lemma, number, is_name=kind == "name"))

    def recur(self, slot: str, kind: str) -> Optional[NP]:
        """Re-mention an entity of the document that `slot` and `kind` allow, if any."""
        nouns = _pool(self.cfg.forbid, slot + "_noun", kind).members
        names = (_pool(self.cfg.forbid, slot + "_noun", "name").members
                 if kind != "inanimate" else frozenset())
        fits = [e for e in self.cast if e.lemma in (names if e.is_name else nouns)]
        if not fits:
            return None
        e = fits[int(self.u() * len(fits))]
        first_mention, e.mentioned = not e.mentioned, True
        if e.is_name:
            return NP(e.lemma)
        det = ("a" if e.number == "sg" else "some") if first_mention else "the"
        if det not in _pool(self.cfg.forbid, slot + "_det", "det_" + e.number).members:
            det = self.pick(slot + "_det", "det_" + e.number)
        return NP(e.lemma, det, e.number)

    def np(self, slot: str, kind: str, pp_depth: int) -> NP:
        """kind: 'animate' (names allowed), 'noun' (any, names allowed) or 'inanimate'."""
        cfg = self.cfg
        if self.cast is not None and self.u() < cfg.p_recur:
            recurring = self.recur(slot, kind)
            if recurring is not None:
                return self.finish_np(slot, recurring, pp_depth)
        if kind != "inanimate" and self.u() < cfg.p_name:
            if _pool(cfg.forbid, slot + "_noun", "name").items:
                return NP(self.pick(slot + "_noun", "name"))
        number = "pl" if self.u() < cfg.p_plural else "sg"
        head = self.pick(slot + "_noun", kind)
        det = self.pick(slot + "_det", "det_" + number)
        return self.finish_np(slot, NP(head, det, number), pp_depth)

    def finish_np(self, slot: str, np_: NP, pp_depth: int) -> NP:
        """Add the optional adjective and PP to a common-noun NP."""
        if np_.det is None:
            return np_
        adj = self.pick(slot + "_adj", "adj") if self.u() < self.cfg.p_adj else None
        pp = None
        if pp_depth > 0 and self.u() < self.cfg.p_pp:
            pp_slot = slot if slot.endswith("_pp") else slot + "_pp"
            prep = self.pick(pp_slot + "_prep", "prep")
            pp = PP(prep, self.np(pp_slot, "inanimate", pp_depth - 1))
        return dataclasses.replace(np_, adj=adj, pp=pp)

    def clause(self, depth: int) -> Clause:
        cfg, prefix = self.cfg, ("cp_" if depth else "")
        tense = "present" if self.u() < cfg.p_present else "past"
        subj_pp = cfg.max_pp_depth if cfg.subj_pp else 0
        if depth < cfg.max_cp_depth and self.u() < cfg.p_cp:
            verb = self.pick(prefix + "verb", "clausal")
            subj = self.np(prefix + "subj", "animate", subj_pp)
            return Clause(verb, tense, subj, ccomp=self.clause(depth + 1))
        if self.u() < cfg.p_transitive:
            verb = self.pick(prefix + "verb", "transitive")
            subj = self.np(prefix + "subj", "animate", subj_pp)
            obj = self.np(prefix + "obj", "noun", cfg.max_pp_depth)
            return Clause(verb, tense, subj, obj)
        verb = self.pick(prefix + "verb", "intransitive")
        kind = "noun" if verb in _UNACCUSATIVE else "animate"
        return Clause(verb, tense, self.np(prefix + "subj", kind, subj_pp))

    def sentence(self) -> Sentence:
        return realize(self.clause(0))


def generate(n: int, seed: int, cfg: GrammarConfig = GrammarConfig()) -> list[Sentence]:
    """n independent active sentences; a pure function of (n, seed, cfg), and
    generate(m, seed)[:n] == generate(n, seed) for m >= n."""
    gen = _Generator(cfg, seed)
    return [gen.sentence() for _ in range(n)]


def corpus(n_docs: int, seed: int, sents_per_doc: tuple[int, int] = (3, 8),
           cfg: GrammarConfig = GrammarConfig()) -> list[list[Sentence]]:
    """Documents of lo..hi sentences (inclusive) that share a few recurring entities."""
    lo, hi = sents_per_doc
    if not 1 <= lo <= hi:
        raise ValueError(f"sents_per_doc must be (lo, hi) with 1 <= lo <= hi, got {sents_per_doc}")
    gen = _Generator(cfg, seed)
    docs = []
    for _ in range(n_docs):
        gen.new_document()
        n = lo + int(gen.u() * (hi - lo + 1))
        docs.append([gen.sentence() for _ in range(n)])
    return docs


def corpus_texts(n_docs: int, seed: int, sents_per_doc: tuple[int, int] = (3, 8),
                 cfg: GrammarConfig = GrammarConfig()) -> list[str]:
    """corpus() with each document as one string, for language-model pretraining."""
    return [" ".join(s.text for s in doc) for doc in corpus(n_docs, seed, sents_per_doc, cfg)]
