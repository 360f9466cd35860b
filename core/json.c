/*
** cozy.json: lossless JSON for the engine, built on lua-cjson 2.1.0.
**
** lua-cjson 2.1.0 (Debian's static liblua5.4-cjson.a) has three defects a
** migration engine must not inherit: `[]` decodes to a table that encodes
** as `{}`, every number decodes as a float, and numbers encode with at most
** 14 significant digits. None of them can be fixed from outside once cjson
** has built its tables (the digits are already gone, and cjson cannot tell
** an empty array from an empty object), and cjson reports neither byte
** offsets nor invalid UTF-8. So the split is:
**
**  - this layer owns the grammar: one validating pass over the input that
**    builds the Lua values directly, reads every number itself (int64 stays
**    a Lua integer, anything else goes through cjson's fpconv_strtod), marks
**    arrays with a shared metatable (json.array_mt) and objects with another
**    (json.object_mt), checks UTF-8, escapes and depth, and names the byte
**    offset of whatever is wrong;
**  - lua-cjson owns string escapes: a string token that contains a backslash
**    is handed, already validated, to a private instance of cjson.decode,
**    which turns \n, \u00e9 and surrogate pairs into UTF-8; on encode, a
**    string that needs escaping goes through cjson.encode (json_encode.c).
**    Strings without escapes (nearly all of a Kubernetes object) are pushed
**    straight from the input, which pays for the validation.
**
** The private cjson instance (luaopen_cjson called, not required) keeps its
** configuration away from anyone who requires "cjson" and changes it.
** vendor/README.md has the longer story.
**
** What Lua code can rely on:
**  - json.decode(s): objects are tables with metatable json.object_mt,
**    arrays tables with json.array_mt (so `[]` and `{}` come back as they
**    went in, even after a migration empties them); null is json.null (the
**    lightuserdata NULL, the same value as cjson.null), also inside arrays,
**    which keep their length; an integer literal that fits int64 is a Lua
**    integer (`-0` is the integer 0), any other number a float; a repeated
**    key keeps its last value. Errors: "cozy.json: <what> at byte N", N
**    counted from 1 as string.byte counts, for malformed JSON, nesting
**    deeper than json.max_depth (1000) and invalid UTF-8 (N is then the
**    first byte of the bad sequence). Lone surrogates in \u escapes are
**    rejected too.
**  - json.decode(s, projection): builds only the parts the projection (a
**    table tree: `true` keeps a subtree, a table descends, ["*"] stands for
**    every array element and for the keys of an object not named) keeps;
**    the rest is validated exactly as above but not built. Arrays met by a
**    table without "*" raise rather than come back empty. docs/engine-api.md
**    has the rules.
**  - json.encode(v): see core/json_encode.c. In short: marked tables encode
**    as marked; an unmarked empty table is `{}`; a non-empty sequence is an
**    array, a table of string keys an object, anything else an error; keys
**    are sorted; integers are exact, floats the shortest text that reads
**    back (2.0 prints as "2.0"); errors name the path, "cozy.json: cannot
**    encode <what> at spec.volumes[2]".
**  - json.array([t]) / json.object([t]) mark t (or a new table) and return
**    it; a table with some other metatable is refused.
**  - json.copy(v) / json.diff(a, b): the deep copy and the RFC 6902
**    difference of values; see core/json_value.c.
*/
#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "host.h"
#include "json.h"

/* The compiled projections of json_projection.c, by their short names. */
typedef CozyJsonProj Proj;
#define KEEP COZY_JSON_KEEP
#define key_projection cozy_json_key_projection

/* From lua-cjson's fpconv.c (exported by liblua5.4-cjson.a, no header):
** strtod that ignores the C library's locale; luaopen_cjson initialises it. */
double fpconv_strtod(const char *nptr, char **endptr);

typedef struct Decoder {
  lua_State *L;
  const char *s; /* start of the input */
  const char *e; /* its end; *e is the '\0' every Lua string ends with */
  /* the last byte from which eight can be read; s when there are fewer
  ** than eight, which no string's content starts at (its quote is first) */
  const char *last_word;
  int depth;
} Decoder;

/* For the few hot helpers a call per string or per key would cost more than
** their bodies (measured with callgrind: bench/README.md). */
#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

const unsigned char cozy_json_string_stop[256] = {
    [0x00 ... 0x1F] = 1, ['"'] = 1, ['\\'] = 1, [0x80 ... 0xFF] = 1};

static int decode_error(Decoder *d, const char *at, const char *what) {
  return luaL_error(d->L, "cozy.json: %s at byte %I", what, (lua_Integer)(at - d->s) + 1);
}

/* "unexpected end of input" or "unexpected character 'x'" at p. */
static int unexpected(Decoder *d, const char *p, const char *wanted) {
  char msg[96];
  unsigned char c = (unsigned char)*p;
  if (p == d->e)
    return decode_error(d, p, lua_pushfstring(d->L, "unexpected end of input, expected %s", wanted));
  if (c >= 0x20 && c < 0x7F) snprintf(msg, sizeof msg, "unexpected character '%c', expected %s", c, wanted);
  else snprintf(msg, sizeof msg, "unexpected byte 0x%02X, expected %s", c, wanted);
  return decode_error(d, p, msg);
}

static const char *skip_space(const char *p) {
  if ((unsigned char)*p > ' ') return p; /* compact JSON: one test, not four */
  while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
  return p;
}

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* The code unit of the \uXXXX at p (p points at the backslash), or -1. */
static long read_u_escape(const char *p) {
  long v = 0;
  int i;
  if (p[0] != '\\' || p[1] != 'u') return -1;
  for (i = 2; i < 6; i++) { /* stops at the first non-hex byte, '\0' included */
    int h = hexval((unsigned char)p[i]);
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

/* 1 for the bytes that make an escape of two bytes after a backslash (all
** but 'u', whose four hex digits check_escape reads): scan_string passes
** over those without a call. */
static const unsigned char short_escape[256] = {
    ['"'] = 1, ['\\'] = 1, ['/'] = 1, ['b'] = 1, ['f'] = 1, ['n'] = 1, ['r'] = 1, ['t'] = 1};

/* Checks the escape at p (a backslash) in the string token that starts at
** str, and returns what follows it. cjson would turn a lone surrogate into
** an error without our offset, so it never gets to see one. */
static const char *check_escape(Decoder *d, const char *str, const char *p) {
  long u;
  switch (p[1]) {
    case '"':
    case '\\':
    case '/':
    case 'b':
    case 'f':
    case 'n':
    case 'r':
    case 't': return p + 2;
    case 'u':
      u = read_u_escape(p);
      if (u < 0) decode_error(d, p, "invalid \\u escape (four hex digits expected)");
      if (u >= 0xDC00 && u <= 0xDFFF) decode_error(d, p, "invalid \\u escape (lone low surrogate)");
      if (u >= 0xD800 && u <= 0xDBFF) {
        long lo = read_u_escape(p + 6);
        if (lo < 0xDC00 || lo > 0xDFFF)
          decode_error(d, p, "invalid \\u escape (high surrogate without a low one)");
        return p + 12;
      }
      return p + 6;
    case '\0':
      if (p + 1 == d->e) decode_error(d, str, "unterminated string");
      /* FALLTHROUGH */
    default: return decode_error(d, p, "invalid escape"), p;
  }
}

/* Eight bytes at a time (SWAR): a word of input whose bytes are all plain
** string content gives 0; otherwise the high bit of each stop byte (see
** cozy_json_string_stop) is set, and bits above the first stop byte may be
** set too. Each subtraction borrows only out of a byte that is itself a stop
** byte (below 0x20, or '"' or '\\' after the xor), so the first flagged byte
** in memory is always a true one; bytes >= 0x80 are flagged by w itself. */
#define COZY_ONES UINT64_C(0x0101010101010101)
#define COZY_HIGHS UINT64_C(0x8080808080808080)

static inline uint64_t stop_bytes(uint64_t w) {
  uint64_t quote = w ^ (COZY_ONES * '"'), backslash = w ^ (COZY_ONES * '\\');
  return ((w - COZY_ONES * 0x20) | (quote - COZY_ONES) | (backslash - COZY_ONES) | w) & COZY_HIGHS;
}

/* The first stop byte at or after q, a byte at a time. */
static inline const char *stop_byte(const char *q) {
  while (!cozy_json_string_stop[(unsigned char)*q]) q++;
  return q;
}

/* The first stop byte of the word at q, given its non-zero stop_bytes().
** A little-endian load puts the first byte in memory lowest; elsewhere the
** borrows run the other way, so the bytes are looked at one by one. */
static inline const char *first_flagged(const char *q, uint64_t stops) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  return q + ((size_t)__builtin_ctzll(stops) >> 3);
#else
  (void)stops;
  return stop_byte(q);
#endif
}

/* The first stop byte at or after q: whole words while eight bytes of input
** remain (memcpy: the input has no alignment), then byte by byte up to the
** '\0' at d->e, itself a stop byte. Plain ASCII runs are most of a document
** (names, uids, annotations), and a byte at a time cost 5 instructions. */
static inline const char *plain_run(const Decoder *d, const char *q) {
  for (; q <= d->last_word; q += 8) {
    uint64_t w, stops;
    memcpy(&w, q, 8);
    stops = stop_bytes(w);
    if (stops) return first_flagged(q, stops);
  }
  return stop_byte(q);
}

/* Checks the string token at p (its opening quote) and returns its closing
** quote; *escaped says whether it holds a backslash. Forced inline: it is
** the hottest loop of decode, and a call per string costs 1.5% of it. */
static ALWAYS_INLINE const char *scan_string(Decoder *d, const char *p, int *escaped) {
  const char *q = p + 1;
  *escaped = 0;
  for (;;) {
    unsigned char c;
    q = plain_run(d, q);
    c = (unsigned char)*q;
    if (c == '"') return q;
    if (c == '\\') {
      *escaped = 1;
      q = short_escape[(unsigned char)q[1]] ? q + 2 : check_escape(d, p, q);
    } else if (c >= 0x80) {
      size_t n = cozy_json_utf8_len((const unsigned char *)q);
      if (n == 0) decode_error(d, q, "invalid UTF-8");
      q += n;
    } else if (q == d->e) {
      decode_error(d, p, "unterminated string");
    } else {
      decode_error(d, q, "control character in string");
    }
  }
}

/* Pushes the string token from p (its opening quote) to q (its closing
** one), checked by scan_string; `escaped` as scan_string said. */
static void push_string(Decoder *d, const char *p, const char *q, int escaped) {
  if (!escaped) {
    lua_pushlstring(d->L, p + 1, (size_t)(q - p - 1));
  } else { /* valid by now: let cjson unescape the whole token */
    lua_State *L = d->L;
    luaL_checkstack(L, 2, "cozy.json: string");
    lua_pushvalue(L, COZY_JSON_CJSON_DECODE);
    lua_pushlstring(L, p, (size_t)(q - p + 1));
    lua_call(L, 1, 1);
  }
}

/* Pushes the string token at p (its opening quote); returns what follows. */
static const char *decode_string(Decoder *d, const char *p) {
  int escaped;
  const char *q = scan_string(d, p, &escaped);
  push_string(d, p, q, escaped);
  return q + 1;
}

static int is_digit(int c) {
  return c >= '0' && c <= '9';
}

/* What scan_number saw: the integer part's digits, and what followed them. */
typedef struct Number {
  const char *digits; /* the integer part, after any '-' */
  size_t ndigits;
  int fraction, exponent;
  long exp; /* the exponent's value; from 100000 up (or down) it stops growing */
} Number;

/* Checks the number at p and returns what follows it. The grammar is RFC
** 8259's, strictly (no leading zeros, '+', '.5', hex, NaN); decoding and
** skipping share it, so both reject the same texts at the same bytes. */
static inline const char *scan_number(Decoder *d, const char *p, Number *n) {
  const char *q = p + (*p == '-');
  n->digits = q;
  if (*q == '0') {
    q++;
    if (is_digit((unsigned char)*q)) decode_error(d, q, "invalid number (leading zero)");
  } else if (is_digit((unsigned char)*q)) {
    while (is_digit((unsigned char)*q)) q++;
  } else {
    unexpected(d, q, "a digit");
  }
  n->ndigits = (size_t)(q - n->digits);
  n->fraction = *q == '.';
  if (n->fraction) {
    if (!is_digit((unsigned char)*++q)) unexpected(d, q, "a digit after '.'");
    while (is_digit((unsigned char)*q)) q++;
  }
  n->exponent = *q == 'e' || *q == 'E';
  n->exp = 0;
  if (n->exponent) {
    int minus = *++q == '-';
    if (*q == '+' || *q == '-') q++;
    if (!is_digit((unsigned char)*q)) unexpected(d, q, "a digit in the exponent");
    for (; is_digit((unsigned char)*q); q++)
      if (n->exp < 100000) n->exp = n->exp * 10 + (*q - '0');
    if (minus) n->exp = -n->exp;
  }
  return q;
}

/* The double of the number from p to q (checked by scan_number). */
static double read_double(Decoder *d, const char *p, const char *q) {
  char *end;
  double v = fpconv_strtod(p, &end);
  if (end != q) decode_error(d, p, "invalid number");
  if (v - v != 0) decode_error(d, p, "number out of range of a double");
  return v;
}

/* Pushes the number at p; returns what follows. An integer literal that
** fits int64 becomes a Lua integer, exactly; any other number is a float. */
static const char *decode_number(Decoder *d, const char *p) {
  Number n;
  const char *q = scan_number(d, p, &n);
  /* 19 digits cannot overflow a uint64_t; 20 (no leading zeros) are beyond int64 */
  if (!n.fraction && !n.exponent && n.ndigits <= 19) {
    uint64_t acc = 0;
    int neg = *p == '-';
    size_t i;
    for (i = 0; i < n.ndigits; i++) acc = acc * 10 + (uint64_t)(n.digits[i] - '0');
    if (acc <= (uint64_t)LUA_MAXINTEGER + neg) {
      /* 0u - acc wraps to the two's complement, as Lua's own l_castU2S does */
      lua_pushinteger(d->L, neg ? (lua_Integer)(0u - acc) : (lua_Integer)acc);
      return q;
    }
  }
  lua_pushnumber(d->L, read_double(d, p, q));
  return q;
}

/* Checks the number at p as decode_number does, without building it. Only
** a number that could be out of a double's range goes through strtod: with
** n integer digits and exponent e it is below 10^(n + e), and below 10^308
** nothing rounds to infinity (an exponent that stopped growing is far past
** 308, or far below, where the bound only gets looser). strtod reads every
** text scan_number accepts, so it has nothing else to say. */
static const char *skip_number(Decoder *d, const char *p) {
  Number n;
  const char *q = scan_number(d, p, &n);
  if (n.exp > DBL_MAX_10_EXP || n.ndigits > (size_t)(DBL_MAX_10_EXP - n.exp)) read_double(d, p, q);
  return q;
}

static int too_deep(Decoder *d, const char *p) {
  return decode_error(d, p, "nesting deeper than " COZY_JSON_STR(COZY_JSON_MAX_DEPTH));
}

static void enter(Decoder *d, const char *p) {
  if (++d->depth > COZY_JSON_MAX_DEPTH) too_deep(d, p);
  luaL_checkstack(d->L, 4, "cozy.json: nesting");
}

static const char *decode_literal(Decoder *d, const char *p, const char *word, size_t len) {
  if ((size_t)(d->e - p) < len || memcmp(p, word, len) != 0) unexpected(d, p, "a JSON value");
  return p + len;
}

/* The scalar at p (no leading space), checked, and pushed when `build`;
** returns what follows it. The one grammar of scalars for decoding and
** skipping: forced inline, each use gets its own copy with `build` fixed. */
static ALWAYS_INLINE const char *walk_scalar(Decoder *d, const char *p, int build) {
  int escaped;
  switch (*p) {
    case '"':
      if (build) return decode_string(d, p);
      return scan_string(d, p, &escaped) + 1;
    case 't':
      if (build) lua_pushboolean(d->L, 1);
      return decode_literal(d, p, "true", 4);
    case 'f':
      if (build) lua_pushboolean(d->L, 0);
      return decode_literal(d, p, "false", 5);
    case 'n':
      if (build) lua_pushlightuserdata(d->L, NULL);
      return decode_literal(d, p, "null", 4);
    case '-':
    case '0':
    case '1':
    case '2':
    case '3':
    case '4':
    case '5':
    case '6':
    case '7':
    case '8':
    case '9': return build ? decode_number(d, p) : skip_number(d, p);
    default: return unexpected(d, p, "a JSON value"), p;
  }
}

/* Skipping: the parts a projection leaves out are checked exactly as
** decode_value checks them (same errors, same offsets, same depth limit),
** but nothing is built and nothing touches the Lua stack. */

/* In a skipped object: checks the key at p and the ':' after it; returns
** the start of the key's value. */
static ALWAYS_INLINE const char *skip_key(Decoder *d, const char *p) {
  int escaped;
  if (*p != '"') unexpected(d, p, "a string (object key)");
  p = skip_space(scan_string(d, p, &escaped) + 1);
  if (*p != ':') unexpected(d, p, "':'");
  return skip_space(p + 1);
}

/* Skips the value at p (no leading space) and returns what follows it. One
** loop for the whole subtree, with the closing bracket of each open level
** in closer[], not a call per value: skipped parts are most of the bytes of
** a projected decode, and the calls (with a Lua stack check per container)
** cost a fifth of skipping. */
static const char *skip_value(Decoder *d, const char *p) {
  char closer[COZY_JSON_MAX_DEPTH + 1];
  const int base = d->depth;
  int depth = base;
  for (;;) {
    switch (*p) { /* p is at a value */
      case '{':
      case '[':
        if (++depth > COZY_JSON_MAX_DEPTH) too_deep(d, p);
        closer[depth] = *p == '{' ? '}' : ']';
        p = skip_space(p + 1);
        if (*p == closer[depth]) { /* empty */
          depth--;
          p++;
          break;
        }
        if (closer[depth] == '}') p = skip_key(d, p);
        continue; /* at its first value */
      default: p = walk_scalar(d, p, 0);
    }
    /* a value ends at p: close the levels it completes, up to the next value */
    for (;;) {
      if (depth == base) return p;
      p = skip_space(p);
      if (*p == ',') {
        p = skip_space(p + 1);
        if (closer[depth] == '}') p = skip_key(d, p);
        break;
      }
      if (*p != closer[depth]) unexpected(d, p, closer[depth] == '}' ? "',' or '}'" : "',' or ']'");
      depth--;
      p++;
    }
  }
}

/* The one walk that builds values: a full decode is the walk under KEEP,
** a projected one under a compiled projection, whose skipped parts go to
** skip_value. Under KEEP no key is looked up and no value skipped. */
static const char *decode_value(Decoder *d, const char *p, const Proj *proj);

/* The key at p (its opening quote) of an object that proj projects: pushed
** when kept, with its projection in *sub (NULL: skipped, nothing pushed);
** returns the start of its value. */
static ALWAYS_INLINE const char *decode_key(Decoder *d, const char *p, const Proj *proj, const Proj **sub) {
  int escaped;
  const char *q;
  if (*p != '"') unexpected(d, p, "a string (object key)");
  q = scan_string(d, p, &escaped);
  if (proj == KEEP) {
    *sub = KEEP;
    push_string(d, p, q, escaped);
  } else if (!escaped) {
    *sub = key_projection(proj, p + 1, (size_t)(q - p - 1));
    if (*sub) push_string(d, p, q, 0);
  } else { /* named by its decoded text, as a Lua table would be */
    size_t len;
    const char *key;
    push_string(d, p, q, 1);
    key = lua_tolstring(d->L, -1, &len);
    *sub = key_projection(proj, key, len);
    if (!*sub) lua_pop(d->L, 1);
  }
  p = skip_space(q + 1);
  if (*p != ':') unexpected(d, p, "':'");
  return skip_space(p + 1);
}

static const char *decode_object(Decoder *d, const char *p, const Proj *proj) {
  lua_State *L = d->L;
  enter(d, p);
  p = skip_space(p + 1);
  /* room for a few keys saves rehashes on the way (and keeps the table's
  ** parts together for encode); the many `{}` of managedFields get none */
  lua_createtable(L, 0, *p == '}' ? 0 : 4);
  lua_pushvalue(L, COZY_JSON_OBJECT_MT);
  lua_setmetatable(L, -2);
  if (*p == '}') {
    d->depth--;
    return p + 1;
  }
  for (;;) {
    const Proj *sub;
    p = decode_key(d, p, proj, &sub);
    if (sub) {
      p = decode_value(d, p, sub);
      lua_rawset(L, -3); /* a repeated key: the last one wins, as in cjson */
    } else {
      p = skip_value(d, p);
    }
    p = skip_space(p);
    if (*p == ',') p = skip_space(p + 1);
    else if (*p == '}') break;
    else unexpected(d, p, "',' or '}'");
  }
  d->depth--;
  return p + 1;
}

static const char *decode_array(Decoder *d, const char *p, const Proj *proj) {
  lua_State *L = d->L;
  const Proj *each = proj == KEEP ? KEEP : proj->star;
  lua_Integer n = 0;
  enter(d, p);
  /* an array projected by a table without "*" would come out empty, and a
  ** migration would read "no volumes" where there are some: refuse it */
  if (!each) decode_error(d, p, "projection has no \"*\" entry for this array");
  lua_newtable(L);
  lua_pushvalue(L, COZY_JSON_ARRAY_MT);
  lua_setmetatable(L, -2);
  p = skip_space(p + 1);
  if (*p == ']') {
    d->depth--;
    return p + 1;
  }
  for (;;) {
    p = skip_space(decode_value(d, p, each));
    lua_rawseti(L, -2, ++n);
    if (*p == ',') p = skip_space(p + 1);
    else if (*p == ']') break;
    else unexpected(d, p, "',' or ']'");
  }
  d->depth--;
  return p + 1;
}

/* Pushes the value at p (no leading space) as proj (KEEP or a node)
** projects it; returns what follows it. A scalar is kept as it is. */
static const char *decode_value(Decoder *d, const char *p, const Proj *proj) {
  switch (*p) {
    case '{': return decode_object(d, p, proj);
    case '[': return decode_array(d, p, proj);
    default: return walk_scalar(d, p, 1);
  }
}

/* Decodes s[0..len) (s[len] must be the '\0' every Lua string ends with)
** with the projection argument at proj_idx (none, nil, true or a table);
** pushes the value. */
static int decode_text(lua_State *L, const char *s, size_t len, int proj_idx) {
  const Proj *proj = cozy_json_projection(L, proj_idx); /* first: it may set the top */
  Decoder d;
  const char *p;
  d.L = L;
  d.s = s;
  d.e = s + len;
  d.last_word = len >= 8 ? s + len - 8 : s;
  d.depth = 0;
  p = skip_space(s);
  p = decode_value(&d, p, proj);
  p = skip_space(p);
  if (p != d.e) unexpected(&d, p, "the end of input");
  return 1;
}

static int json_decode(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  return decode_text(L, s, len, 2);
}

/* decode_buffer(pointer, length, projection): json.decode of bytes the
** transport holds, without copying them into a Lua string first (a list page
** is megabytes). Kept in the registry, out of reach of Lua code, since it
** reads wherever the pointer points. */
static int json_decode_buffer(lua_State *L) {
  const char *s = (const char *)lua_touserdata(L, 1);
  lua_Integer len = luaL_checkinteger(L, 2);
  luaL_argcheck(L, lua_islightuserdata(L, 1) && s != NULL && len >= 0 && s[len] == '\0', 1,
                "a NUL-terminated buffer");
  return decode_text(L, s, (size_t)len, 3);
}

void cozy_json_push_buffer_decoder(lua_State *L) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, COZY_JSON_BUFFER_DECODER) != LUA_TFUNCTION) {
    lua_pop(L, 1);
    luaL_requiref(L, "cozy.json", luaopen_cozy_json, 0);
    lua_pop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, COZY_JSON_BUFFER_DECODER);
  }
}

/* Marks t (or a new table) with the metatable at index `mt`; a table that
** already carries the other marker may switch, any other metatable is kept
** out so that a marking never replaces behaviour the caller relies on. */
static int mark(lua_State *L, int mt) {
  if (lua_isnoneornil(L, 1)) {
    lua_settop(L, 0);
    lua_newtable(L);
  }
  luaL_checktype(L, 1, LUA_TTABLE);
  if (lua_getmetatable(L, 1)) {
    if (!lua_rawequal(L, -1, COZY_JSON_ARRAY_MT) && !lua_rawequal(L, -1, COZY_JSON_OBJECT_MT))
      return luaL_argerror(L, 1, "table already has a metatable");
    lua_pop(L, 1);
  }
  lua_settop(L, 1);
  lua_pushvalue(L, mt);
  lua_setmetatable(L, 1);
  return 1;
}

/* json.array([t]): marks t (or a new table) as a JSON array. */
static int json_array(lua_State *L) {
  return mark(L, COZY_JSON_ARRAY_MT);
}

/* json.object([t]): marks t (or a new table) as a JSON object. */
static int json_object(lua_State *L) {
  return mark(L, COZY_JSON_OBJECT_MT);
}

static const luaL_Reg json_funcs[] = {{"decode", json_decode},    {"encode", cozy_json_encode},
                                      {"array", json_array},      {"object", json_object},
                                      {"copy", cozy_json_copy},   {"diff", cozy_json_diff},
                                      {"holds", cozy_json_holds}, {NULL, NULL}};

static void new_marker(lua_State *L, const char *name) {
  lua_createtable(L, 0, 1);
  lua_pushstring(L, name);
  lua_setfield(L, -2, "__name");
}

int luaopen_cozy_json(lua_State *L) {
  cozy_json_open_scratch(L);
  luaL_newlibtable(L, json_funcs);
  new_marker(L, "cozy.json.array");
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "array_mt");
  new_marker(L, "cozy.json.object");
  lua_pushvalue(L, -1);
  lua_setfield(L, -4, "object_mt");
  /* a private cjson, whose settings nobody else can change */
  lua_pushcfunction(L, luaopen_cjson);
  lua_call(L, 0, 1);
  lua_getfield(L, -1, "decode");
  lua_getfield(L, -2, "encode");
  lua_remove(L, -3);
  lua_pushvalue(L, -4); /* the upvalues again, for the buffer decoder */
  lua_pushvalue(L, -4);
  lua_pushvalue(L, -4);
  lua_pushvalue(L, -4);
  lua_pushcclosure(L, json_decode_buffer, 4);
  lua_setfield(L, LUA_REGISTRYINDEX, COZY_JSON_BUFFER_DECODER);
  luaL_setfuncs(L, json_funcs, 4);
  lua_pushlightuserdata(L, NULL); /* the same value as cjson.null */
  lua_setfield(L, -2, "null");
  lua_pushinteger(L, COZY_JSON_MAX_DEPTH);
  lua_setfield(L, -2, "max_depth");
  return 1;
}
