-- cozy.kube.patch: the local RFC 6902 / RFC 7386 application behind
-- dry_run = "client", and the comparison behind the create read-back rule.
local patch = require "cozy.kube.patch"
local json = require "cozy.json"

local function apply(doc, ops)
  return json.encode(patch.json_patch(json.decode(doc), json.decode(ops)))
end

describe("cozy.kube.patch", function()
  describe("json_patch (RFC 6902 appendix A)", function()
    it("adds an object member, inserts and appends to arrays", function()
      assert.equal('{"baz":"qux","foo":"bar"}', apply('{"foo":"bar"}', '[{"op":"add","path":"/baz","value":"qux"}]'))
      assert.equal('{"foo":["bar","qux","baz"]}',
        apply('{"foo":["bar","baz"]}', '[{"op":"add","path":"/foo/1","value":"qux"}]'))
      assert.equal('{"foo":["bar",["abc","def"]]}',
        apply('{"foo":["bar"]}', '[{"op":"add","path":"/foo/-","value":["abc","def"]}]'))
    end)

    it("removes, replaces, moves and copies", function()
      assert.equal('{"foo":"bar"}', apply('{"baz":"qux","foo":"bar"}', '[{"op":"remove","path":"/baz"}]'))
      assert.equal('{"foo":["bar","baz"]}', apply('{"foo":["bar","qux","baz"]}', '[{"op":"remove","path":"/foo/1"}]'))
      assert.equal('{"baz":"boo","foo":"bar"}',
        apply('{"baz":"qux","foo":"bar"}', '[{"op":"replace","path":"/baz","value":"boo"}]'))
      assert.equal('{"foo":["all","cows","eat","grass"]}',
        apply('{"foo":["all","grass","cows","eat"]}', '[{"op":"move","from":"/foo/1","path":"/foo/3"}]'))
      assert.equal('{"a":{"b":1},"c":{"b":1}}', apply('{"a":{"b":1}}', '[{"op":"copy","from":"/a","path":"/c"}]'))
    end)

    it("unescapes ~1 and ~0 in pointers", function()
      assert.equal('{"a/b":1,"m~n":2}',
        apply('{"a/b":0,"m~n":0}', '[{"op":"replace","path":"/a~1b","value":1},{"op":"replace","path":"/m~0n","value":2}]'))
    end)

    it("tests values, failing with test_failed", function()
      assert.equal('{"baz":"qux"}', apply('{"baz":"qux"}', '[{"op":"test","path":"/baz","value":"qux"}]'))
      local ok, err = pcall(apply, '{"baz":"qux"}', '[{"op":"test","path":"/baz","value":"bar"}]')
      assert.is_false(ok)
      assert.is_true(err.test_failed)
      assert.matches("op 1", err.patch_error)
    end)

    it("fails on absent targets, bad indexes and unknown ops, leaving the input intact", function()
      local doc = json.decode('{"foo":["a"]}')
      for _, ops in ipairs {
        '[{"op":"remove","path":"/nope"}]', '[{"op":"replace","path":"/nope","value":1}]',
        '[{"op":"add","path":"/foo/5","value":1}]', '[{"op":"add","path":"/foo/01","value":1}]',
        '[{"op":"add","path":"/x/y","value":1}]', '[{"op":"frobnicate","path":"/foo"}]',
      } do
        local ok, err = pcall(patch.json_patch, doc, json.decode(ops))
        assert.is_false(ok, ops)
        assert.is_string(err.patch_error)
      end
      assert.equal('{"foo":["a"]}', json.encode(doc))
    end)

    it("keeps empty arrays and big integers", function()
      assert.equal('{"a":[],"n":12345678901234567,"x":1}',
        apply('{"a":[],"n":12345678901234567}', '[{"op":"add","path":"/x","value":1}]'))
    end)
  end)

  describe("merge_patch (RFC 7386)", function()
    it("merges, deletes with null and replaces arrays", function()
      local out = patch.merge_patch(json.decode('{"a":"b","c":{"d":"e","f":"g"},"l":[1,2]}'),
        json.decode('{"a":"z","c":{"f":null},"l":[3]}'))
      assert.equal('{"a":"z","c":{"d":"e"},"l":[3]}', json.encode(out))
    end)
  end)

  describe("contains", function()
    it("is true when every sent field matches, whatever the server added", function()
      local got = json.decode('{"metadata":{"name":"x","uid":"u","resourceVersion":"5","labels":{"a":"1"}},"data":{"k":"v"}}')
      assert.is_true(patch.contains(got, json.decode('{"metadata":{"name":"x","labels":{"a":"1"}},"data":{"k":"v"}}')))
      assert.is_false(patch.contains(got, json.decode('{"metadata":{"name":"x"},"data":{"k":"other"}}')))
      assert.is_false(patch.contains(got, json.decode('{"metadata":{"name":"x"},"data":{"k":"v","k2":"v2"}}')))
    end)
  end)

  describe("json_patch, shared", function()
    local doc_text = '{"metadata":{"name":"x","labels":{"a":"1"}},"spec":{"template":{"volumes":[{"name":"a"},'
      .. '{"name":"b"}],"disks":[{"name":"a"}]},"other":{"k":[1,2]}},"status":{"phase":"Running"}}'
    local cases = {
      '[{"op":"add","path":"/spec/template/volumes/-","value":{"name":"c"}}]',
      '[{"op":"remove","path":"/spec/template/volumes/0"},{"op":"replace","path":"/metadata/labels/a","value":"2"}]',
      '[{"op":"move","from":"/spec/other","path":"/status/other"},{"op":"copy","from":"/metadata/labels",'
        .. '"path":"/spec/labels"}]',
      '[{"op":"test","path":"/status/phase","value":"Running"},{"op":"add","path":"/spec/template/disks/0",'
        .. '"value":{"name":"z"}}]',
      '[{"op":"replace","path":"","value":{"kind":"Other"}},{"op":"add","path":"/x","value":1}]',
      '[{"op":"move","from":"/spec","path":""},{"op":"add","path":"/template/new","value":true}]',
    }

    it("gives what the copying one gives, and leaves doc as it was", function()
      for _, ops in ipairs(cases) do
        local doc = json.decode(doc_text)
        local want = json.encode(patch.json_patch(json.decode(doc_text), json.decode(ops)))
        assert.equal(want, json.encode(patch.json_patch(doc, json.decode(ops), true)), ops)
        assert.equal(json.encode(json.decode(doc_text)), json.encode(doc), ops)
      end
    end)

    it("shares every table the ops leave alone, and no table they change", function()
      local doc = json.decode(doc_text)
      local got = patch.json_patch(doc, json.decode(cases[1]), true)
      assert.equal(doc.metadata, got.metadata)
      assert.equal(doc.status, got.status)
      assert.equal(doc.spec.other, got.spec.other)
      assert.equal(doc.spec.template.disks, got.spec.template.disks)
      assert.equal(doc.spec.template.volumes[1], got.spec.template.volumes[1])
      assert.are_not.equal(doc, got)
      assert.are_not.equal(doc.spec, got.spec)
      assert.are_not.equal(doc.spec.template, got.spec.template)
      assert.are_not.equal(doc.spec.template.volumes, got.spec.template.volumes)
      assert.equal(json.array_mt, getmetatable(got.spec.template.volumes))
    end)

    it("fails as the copying one fails, doc untouched", function()
      for _, ops in ipairs { '[{"op":"add","path":"/spec/nope/x","value":1}]',
        '[{"op":"remove","path":"/spec/template/volumes/01"}]', '[{"op":"frobnicate","path":"/x"}]',
        '[{"op":"test","path":"/status/phase","value":"Stopped"}]' } do
        local _, want = pcall(patch.json_patch, json.decode(doc_text), json.decode(ops))
        local doc = json.decode(doc_text)
        local _, got = pcall(patch.json_patch, doc, json.decode(ops), true)
        assert.same(want, got, ops)
        assert.equal(json.encode(json.decode(doc_text)), json.encode(doc), ops)
      end
    end)
  end)
end)
