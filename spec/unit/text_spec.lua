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
    assert.equal("https://host/path@v1", text.redact("https://host/path@v1"))
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
end)
