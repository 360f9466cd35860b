-- cozy.text: outside bytes made printable (valid UTF-8, credentials
-- blanked, cut at a character boundary).
local text = require "cozy.text"

describe("cozy.text", function()
  it("replaces each byte that starts no valid UTF-8 sequence by U+FFFD, keeping valid text", function()
    assert.equal("caf\u{FFFD} cr\u{FFFD}me", text.utf8("caf\233 cr\232me"))
    assert.equal("na\u{EF}ve \u{FFFD}\u{FFFD}", text.utf8("na\u{EF}ve \255\254"))
    assert.equal("\u{FFFD}", text.utf8("\195"))
    assert.equal("plain", text.utf8("plain"))
  end)

  it("blanks a URL's user-info, a bearer token and an Authorization header", function()
    assert.equal("Unsupported proxy syntax in 'http://***@[::1'",
      text.redact("Unsupported proxy syntax in 'http://admin:s3cret@[::1'"))
    assert.equal("socks5h://***@proxy:1080/x", text.redact("socks5h://u:p@proxy:1080/x"))
    assert.equal("token Bearer *** here", text.redact("token Bearer eyJ.abc-def_ghi/+= here"))
    assert.equal("-H 'Authorization: ***", text.redact("-H 'Authorization: Basic dXNlcjpwYXNz'"))
  end)

  -- issue 35: a password is any bytes up to the last '@' a host follows
  it("blanks a user-info whose password holds a '/', a space, a quote or an '@', raw or percent-encoded", function()
    for _, case in ipairs {
      { "proxy http://user:pa/ss@proxy:3128 refused", "proxy http://***@proxy:3128 refused" },
      { "http://user:pa ss@proxy:3128", "http://***@proxy:3128" },
      { "Unsupported proxy syntax in 'http://u:pa\"ss'@proxy:3128'", "Unsupported proxy syntax in 'http://***@proxy:3128'" },
      { "http://u:p@ss@w@rd@[::1]:3128/x", "http://***@[::1]:3128/x" },
      { "http://u:p%40ss%2Fw%20d@proxy", "http://***@proxy" },
      { "server=https://admin:pa/ss@10.0.0.1:6443 source=kc", "server=https://***@10.0.0.1:6443 source=kc" },
      -- two URLs on a line, and a line break: each user-info ends in its own URL
      { "a http://u:p/1@h1 b https://v:p/2@h2\nc@d", "a http://***@h1 b https://***@h2\nc@d" },
    } do
      assert.equal(case[2], text.redact(case[1]))
    end
  end)

  it("leaves a URL without user-info as it is; a '@' later on its line hides the text before it", function()
    assert.equal("http://proxy:3128 refused", text.redact("http://proxy:3128 refused"))
    assert.equal("https://host/path @ 5", text.redact("https://host/path @ 5")) -- no host after the '@'
    -- a raw '/' in a password cannot be told from a path: more hidden, no password shown
    assert.equal("https://***@v1", text.redact("https://host/path@v1"))
  end)

  it("stays linear on adversarial text", function()
    for _, s in ipairs { ("://a"):rep(200000), ("://" .. ("@"):rep(10)):rep(50000), "://" .. ("@x"):rep(300000) } do
      local t0 = os.clock()
      text.redact(s)
      assert.is_true(os.clock() - t0 < 1, "text.redact took " .. (os.clock() - t0) .. "s")
    end
  end)

  it("safe_prefix blanks before it cuts: no part of a password cut short of its '@'", function()
    local s = ("x"):rep(50) .. " http://user:" .. ("p"):rep(100) .. "@proxy:3128"
    local cut = text.safe_prefix(s, 80, "...")
    assert.equal(("x"):rep(50) .. " http://***@proxy:3128", cut)
    assert.not_matches("pp", text.safe_prefix(s, 70, "..."))
  end)

  it("json() blanks every string of a value, keys too, keeping JSON arrays and objects", function()
    local json = require "cozy.json"
    local v = json.decode('{"a":["http://u:p/w@h"],"http://k:s@h":{"x":1}}')
    assert.equal('{"a":["http://***@h"],"http://***@h":{"x":1}}', text.json(v))
    assert.equal("[]", text.json(json.decode("[]")))
  end)

  it("cuts before a UTF-8 sequence, never inside one", function()
    local s = ("x"):rep(199) .. "\u{E9}z"
    assert.equal(("x"):rep(199), text.prefix(s, 200))
    assert.equal(("x"):rep(199) .. "\u{E9}", text.prefix(s, 201))
    assert.equal("abc", text.prefix("abc", 10))
  end)

  it("safe() does both, for any value", function()
    assert.equal("http://***@h \u{FFFD}", text.safe("http://a:b@h \255"))
    assert.equal("42", text.safe(42))
  end)

  it("line() escapes every control character from outside, once however often it is applied", function()
    assert.equal("a\\nb\\r\\tc\\x1b[2J\\x07\\x00\\x7f d\\e", text.line("a\nb\r\tc\27[2J\7\0\127 d\\e"))
    assert.equal(text.line("x\ny\27"), text.line(text.line("x\ny\27")))
    assert.equal("caf\u{FFFD} http://***@h", text.line("caf\233 http://u:p@h"))
    -- C1 controls (U+009B is CSI to a terminal): escaped as well
    assert.equal("a\\u009b2Jb\\u0085c \u{A0}", text.line("a\u{9B}2Jb\u{85}c \u{A0}"))
  end)

  it("lines() lays out lines whose values cannot start a line of their own", function()
    assert.equal("a: x\\ny\nb\n", text.lines({ "a: x\ny", "b" }))
    assert.equal("", text.lines({}))
  end)

  it("json() encodes what json.encode refuses: a string cut inside a UTF-8 sequence, in keys too", function()
    local json = require "cozy.json"
    assert.equal('{"caf\u{FFFD}":["x\u{FFFD}\u{FFFD}"],"e":{}}',
      text.json({ ["caf\195"] = json.array { "x\226\130" }, e = json.object {} }))
  end)

  -- text.lines and text.json look at the whole text once before they make
  -- a copy: the same output as line by line and string by string, which
  -- these cases check against text.line and text.printable themselves
  describe("a whole report at once", function()
    local json = require "cozy.json"
    local function each(list)
      local out = {}
      for i, l in ipairs(list) do out[i] = text.line(l) .. "\n" end
      return table.concat(out)
    end
    local pieces = { "plain", "  - name: a", "", " ", "://", "http://u:p@h/x", "Bearer abc.def", "bearer  x",
      "Authorization: Basic x", "\t", "\n", "\r", "\27[31m", "\0", "\127", "\194\155", "\194\160", "caf\233",
      "\195", "\226\130", "\u{FFFD}", "é", "earer", "uthorization", "@", "/", "x" }

    it("lines() gives text.line's lines, for lines with and without what text.line changes", function()
      local seed = 7
      local function rand(n)
        seed = (seed * 1103515245 + 12345) % 2147483648
        return seed % n + 1
      end
      for _ = 1, 3000 do
        local list = {}
        for i = 1, rand(5) - 1 do
          local parts = {}
          for j = 1, rand(4) do parts[j] = pieces[rand(#pieces)] end
          list[i] = table.concat(parts)
        end
        assert.equal(each(list), text.lines(list), json.encode(text.printable(list)))
      end
      assert.equal("1\ntrue\n", text.lines({ 1, true }))
      assert.equal("a\n", text.lines({ "a", nil, "c" }))
    end)

    it("json() gives what encoding text.printable's copy gives", function()
      for _, a in ipairs(pieces) do
        for _, b in ipairs(pieces) do
          local v = { [a .. "k"] = json.array { b, a .. b }, n = 1, z = json.null, o = json.object {} }
          assert.equal(json.encode(text.printable(v)), text.json(v), a .. " / " .. b)
        end
      end
    end)
  end)
end)
