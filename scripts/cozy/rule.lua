-- A migration as a rule (docs/engine-api.md, "Rules"): the objects it reads
-- and changes are declared by kubectl-style resource name (`select`), its
-- one entry `walk(ctx, s)` runs in run, plan and check alike, and the engine
-- owns the policy: permissions derived from the selections, the failure
-- policy of each (reads, writes), counts, names in messages, progress, the
-- outcome record and the summary. Pure Lua over ctx; in the sandbox.
--   return rule {
--     description = "...",
--     select = { clusters = { "kuberneteses.apps.cozystack.io", project = { "spec.version" },
--                             edit = true, writes = "leave" } },
--     walk = function(ctx, s) s.clusters:each(function(k) ... return changed end) end,
--   }
local errors = require "cozy.errors"
local json = require "cozy.json"
local kerrors = require "cozy.kube.errors"
local match = require "cozy.match"
local obj = require "cozy.obj"
local patch = require "cozy.kube.patch"
local recipe = require "cozy.recipe"
local validate = require "cozy.validate"

local rule = {}

-- What a selection may declare, and the values of its policies.
local FIELDS = {
  project = "table", namespace = "string", name = "string", label_selector = "string",
  field_selector = "string", edit = "boolean", patch = "boolean", delete = "boolean",
  check_only = "boolean",
  report = "boolean", writes = "string", reads = "string", failed = "string", unlisted = "string",
  unserved = "string", outcome = "table", say = "string|function", retry = "table",
  label = "string",
  noun = "string", gone = "string", where = "table|function", refused = "string",
  finding = "table",
}
local RULE_FIELDS = { description = true, select = true, walk = true, timeout = true,
  tools = true, parameters = true, files = true, finally = true }

local function refuse(fmt, ...) error("cozy.rule: " .. fmt:format(...), 3) end

-- The permissions a selection needs, known at load time: list (get for one
-- named object), get and patch to edit or patch (get: the re-read after a conflict),
-- get and delete to delete; scoped to its namespace (and name) when declared.
local function permissions_of(key, decl, out)
  local verbs = { decl.name and "get" or "list" }
  if decl.edit or decl.patch then verbs[#verbs + 1], verbs[#verbs + 2] = "get", "patch" end
  if decl.delete then verbs[#verbs + 1], verbs[#verbs + 2] = "get", "delete" end
  for _, resource in ipairs(decl) do
    local ok, plural, group = pcall(recipe.resource_name, resource)
    if not ok then refuse("select.%s: %s", key, tostring(plural):gsub("^cozy%.recipe: ", "")) end
    local seen = {}
    for _, verb in ipairs(verbs) do
      if not seen[verb] then
        seen[verb] = true
        out[#out + 1] = { verb = verb, group = group, resource = plural,
          namespace = decl.name and decl.namespace or nil, name = decl.name,
          check_only = decl.check_only or nil }
      end
    end
  end
end

local function check_selection(key, decl)
  local function checked(name, value, expected, more)
    local why = validate.why(name, value, expected, more)
    if why then refuse("%s", why) end
  end
  checked("select." .. key, decl, "table", { says = "a table { \"resource\", ... }" })
  checked("select." .. key .. "[1]", decl[1], "string", { says = "a resource name" })
  for k, v in pairs(decl) do
    if type(k) == "number" then
      checked(("select.%s[%d]"):format(key, k), v, "string", { says = "a resource name" })
    elseif FIELDS[k] == nil then
      refuse("select.%s: unknown field %q", key, tostring(k))
    else
      local types = {}
      for t in FIELDS[k]:gmatch("[^|]+") do types[#types + 1] = t end
      checked(("select.%s.%s"):format(key, k), v, types)
    end
  end
  checked(("select.%s.writes"):format(key), decl.writes,
    { one_of = { "stop", "fail", "leave", "warn" } }, true)
  checked(("select.%s.reads"):format(key), decl.reads,
    { one_of = { "stop", "warn", "leave" } }, true)
  if decl.name and not decl.namespace then
    refuse("select.%s: a named object needs its namespace", key)
  end
  if decl.finding then
    checked(("select.%s.finding[1]"):format(key), decl.finding[1],
      { one_of = { "info", "warn", "block" } })
    checked(("select.%s.finding[2]"):format(key), decl.finding[2], "string",
      { says = "the finding's text ({key}: the object's namespace/name)" })
    if decl.edit then refuse("select.%s: a selection that edits declares no finding", key) end
  end
  if type(decl.where) == "table" then
    for path, globs in pairs(decl.where) do
      checked(("select.%s.where key"):format(key), path, "string", { says = "a dotted path" })
      checked(("select.%s.where[%q]"):format(key, path), globs, { "string", "table" },
        { says = "a glob or an array of globs" })
      for _, glob in ipairs(type(globs) == "table" and globs or { globs }) do
        local ok, why = pcall(match.check, glob)
        if not ok then refuse("select.%s.where[%q]: %s", key, path, tostring(why)) end
      end
    end
  end
end

-- The projection a selection lists: its declared paths and those its `where`
-- reads (an undeclared projection stays whole objects).
local function projection_of(decl)
  if decl.project == nil or type(decl.where) ~= "table" then return decl.project end
  local paths, seen = {}, {}
  for _, path in ipairs(decl.project) do paths[#paths + 1], seen[path] = path, true end
  local extra = {}
  for path in pairs(decl.where) do if not seen[path] then extra[#extra + 1] = path end end
  table.sort(extra)
  for _, path in ipairs(extra) do paths[#paths + 1] = path end
  return paths
end

-- Does o pass the selection's `where`: a function of it, or dotted paths whose
-- (string) value, or one element of whose array value, matches a glob (or one
-- of an array of globs), each?
local function passes(where, o)
  if where == nil then return true end
  if type(where) == "function" then return where(o) end
  for path, globs in pairs(where) do
    local v, any = obj.get(o, path), false
    for _, each in ipairs(type(v) == "table" and v or { v }) do
      any = any or type(each) == "string" and match.any(globs, each)
    end
    if not any then return false end
  end
  return true
end

-- A change line from `say`: a function of what the edit returned, or a template: its %s
-- that value; when the edit returned a table, each {field} that field of it (an array
-- of named items: their names, as obj.names).
local function said_text(say, said)
  if type(say) == "function" then return say(said) end
  if type(said) ~= "table" then return say:format(tostring(said)) end
  return (say:gsub("{([%w_]+)}", function(field)
    local v = said[field]
    if v == nil then return nil end
    return type(v) == "table" and obj.names(v) or tostring(v)
  end))
end

-- Signals a read that failed under reads = "leave": the walk ends there and
-- the version is left with that reason.
local LEAVE = setmetatable({}, {
  __tostring = function() return "cozy.rule: leave the version" end,
})

-- The facade of one declared selection, for one step.
local function selection(ctx, key, decl, state)
  local s, found = {}, {}
  state.counts[key] = { changed = 0, unchanged = 0, absent = 0, failed = 0, names = {} }
  local tally = state.counts[key]
  local project = projection_of(decl)
  local function lookup(name)
    if found[name] == nil then
      local res, about = ctx.kube:lookup(name)
      found[name] = { res = res, about = about }
    end
    return found[name]
  end
  -- every resource of the selection served, or false and the first that is not, and why
  local function served()
    for _, name in ipairs(decl) do
      local f = lookup(name)
      if f.res == nil then return false, name, f.about end
    end
    return true
  end
  local function unserved(name, why, finding)
    if decl.unserved == "stop" then
      error(kerrors.new { code = 404, reason = "NotFound", absent = "type",
        message = ("the server doesn't have a resource type %s (%s)"):format(name, tostring(why)),
      }, 0)
    end
    local line = (decl.unserved or "{resource} not served ({why}): nothing to change")
      :gsub("{resource}", (name:gsub("%%", "%%%%")))
      :gsub("{why}", (tostring(why):gsub("%%", "%%%%")))
    if finding then return ctx:finding("info", line) end
    ctx.log:info(line)
  end
  -- a read that failed after the engine's retries, under the declared policy
  local function unread(e)
    if (decl.reads or "stop") == "stop" or not kerrors.is_item_error(e) or e.method ~= "GET" then
      error(e, 0)
    end
    local line = (decl.unlisted or (key .. " not listed: %s")):format(tostring(e.message))
    if decl.reads == "warn" then return ctx.log:warn(line) end
    state.leave = line
    error(LEAVE, 0)
  end
  local function listing(res, opts)
    return res:list { namespace = opts.namespace or decl.namespace, project = project,
      label_selector = opts.label_selector or decl.label_selector,
      field_selector = decl.field_selector }
  end
  local function name_of(resource, o)
    return (#decl > 1 and (resource .. " ") or "") .. obj.key(o)
  end

  function s.served() return served() end

  -- objects already held: an array, a queue, or a function returning the next
  local function iterate(items)
    local pull
    if type(items) == "function" then pull = items
    elseif type(items.drain) == "function" then pull = items:drain()
    elseif type(items.next) == "function" then pull = function() return items:next() end
    else
      local i = 0
      pull = function() i = i + 1 return items[i] end
    end
    if decl.where == nil then return pull end
    return function() -- the objects the selection's `where` passes, with their values
      local o, value = pull()
      while o ~= nil and not passes(decl.where, o) do o, value = pull() end
      return o, value
    end
  end
  -- an edit, on a copy of its own: the copy it is handed changes only when
  -- the edit says it changed something
  -- (an edit that returns false and a reason refuses the object: one warning,
  -- the `refused` template with its name and the reason, and nothing is sent)
  local warned = {}
  local function edit_with(fn, noun)
    return function(copy, item, value)
      local work = patch.deepcopy(copy)
      local said, why = fn(work, item, value)
      if said then
        for k in pairs(copy) do copy[k] = nil end
        for k, v in pairs(work) do copy[k] = v end
      elseif why ~= nil and not warned[obj.key(copy)] then
        warned[obj.key(copy)] = true
        ctx.log:warn((decl.refused or (noun .. " %s left as it is: %s"))
          :format(obj.key(copy), tostring(why)))
      end
      return said
    end
  end
  local function edit_pass(res, kind, resource, fn, opts, pass, landed)
    local items = iterate(opts.items or listing(res, opts))
    local policy, noun = decl.writes or "stop", decl.noun or (#decl > 1 and resource or kind)
    if ctx.mode == "check" and decl.report == false then
      -- check without listing the writes (the migration's findings say them):
      -- the edit on a copy, counted
      for o, value in items do
        local n = edit_with(fn, noun)(patch.deepcopy(o), o, value) and "changed" or "unchanged"
        pass[n] = pass[n] + 1
      end
      return
    end
    local counts, failures = res:update_each(items, edit_with(fn, noun), {
      label = opts.label or decl.label or ((decl.noun or kind) .. "s"), absent = "skip",
      project = project, on_error = policy == "stop" and "stop" or "continue", retry = decl.retry,
      absent_note = decl.gone,
      total = opts.items and type(opts.items.len) == "function" and opts.items:len() or nil,
      describe = function(o) return noun .. " " .. obj.key(o) end,
      on_change = function(o, said)
        -- nil: an earlier attempt of its own landed
        if said == nil then return end
        landed[#landed + 1] = said
        if decl.say == nil then return end
        local text = said_text(decl.say, said)
        ctx.log:change((("%s %s: %s"):format(noun, obj.key(o), text):gsub("%%", "%%%%")))
      end,
    })
    for k in pairs(pass) do pass[k] = pass[k] + (counts[k] or 0) end
    for _, f in ipairs(failures) do
      tally.names[#tally.names + 1] = name_of(resource, { metadata = f })
    end
  end

  -- The one iteration: fn for every object of the selection. Edited
  -- (edit = true): fn(copy, item, value) edits the copy and returns whether
  -- it changed it (a value other than true is what the change line says);
  -- the engine sends the difference, counts, names and applies the failure
  -- policy. Read: fn(object) for each. opts: namespace, label_selector
  -- (narrowing the declared ones), items (objects already held: an array or
  -- a queue, instead of a list), label (of the progress and summary lines).
  -- Returns the counts of this pass (with landed, what each edit that landed
  -- returned, and sum), or nil when the API is not served, the selection is
  -- check_only outside check, or a read failed under reads = "warn".
  function s.each(fn, opts)
    validate.arg(2, "each(fn, opts)", "fn", fn, "function")
    opts = opts or {}
    if decl.check_only and ctx.mode ~= "check" then return nil end
    local pass, any, landed = { changed = 0, unchanged = 0, absent = 0, failed = 0 }, false, {}
    local done, err = pcall(function()
      for _, resource in ipairs(decl) do
        local f = lookup(resource)
        local res, kind = f.res, f.res and f.about.kind
        if res == nil then
          unserved(resource, f.about) -- each resource of the selection on its own
        elseif decl.edit then
          any = true
          edit_pass(res, kind, resource, fn, opts, pass, landed)
        else
          any = true
          for o in iterate(opts.items or listing(res, opts)) do fn(o) end
        end
      end
    end)
    if not done then return unread(err) end
    for k, v in pairs(pass) do tally[k] = tally[k] + v end
    -- what each edit that landed returned, for a migration's own summary;
    -- pass:sum("volumes"): the lengths (or numbers) of that field of each, added
    pass.landed = landed
    function pass.sum(_, field)
      local n = 0
      for _, said in ipairs(landed) do
        local v = type(said) == "table" and said[field]
        n = n + (type(v) == "table" and #v or math.type(v) and v or 0)
      end
      return n
    end
    return any and pass or nil
  end

  -- The one object a named selection declares (namespace and name), or nil.
  function s.find()
    local ok, missing, why = served()
    if not ok then return unserved(missing, why) end
    return found[decl[1]].res:find(decl.namespace, decl.name)
  end
  -- The first object of the selection (its label_selector), or nil.
  function s.first(opts)
    local ok, missing, why = served()
    if not ok then return unserved(missing, why) end
    local list = found[decl[1]].res:list { namespace = (opts or {}).namespace or decl.namespace,
      label_selector = decl.label_selector, project = decl.project, limit = 1 }
    return list:next()
  end
  -- the selection's (first) resource, served: else its unserved policy
  local function resource()
    local f = lookup(decl[1])
    if f.res == nil then
      unserved(decl[1], f.about)
      error(("%s is not served"):format(decl[1]), 0)
    end
    return f.res
  end
  -- Writes to one object held (listed, found): nil when it is gone meanwhile.
  local function held(what)
    return function(o, ...)
      local res, md = resource(), o.metadata
      if md.namespace == nil then return res[what](res, md.name, ...) end
      return res[what](res, md.namespace, md.name, ...)
    end
  end
  local merge, delete = held("merge_patch"), held("delete")
  function s.merge_patch(o, changes) return merge(o, changes, { absent = "skip" }) end
  function s.delete(o) return delete(o, { absent = "skip" }) end
  function s.read_back(written) return resource():read_back(written) end
  -- The join by owner: each right object under the left object its controller
  -- ownerReference (of the left's kind and group) names; adopt: one without a
  -- controller under the left object of its own name. Right objects are skipped, with
  -- why, when their controller is of another kind, when it names another uid than the
  -- left object's (notable), and when no left object claims them (at the end).
  local function owner_join(right, adopt)
    local kind, noun = lookup(decl[1]).about.kind, decl.noun or lookup(decl[1]).about.kind
    local _, group = recipe.resource_name(decl[1])
    group = group ~= "" and group or nil -- core: an apiVersion without a group
    local counted = 0
    local function under(o, name)
      local ns = obj.get(o, "metadata.namespace")
      return (ns and (ns .. "/") or "") .. tostring(name)
    end
    local j = ctx:join(iterate(listing(resource(), {})), right:_listing(), { key = function(o)
      counted = counted + 1
      local ref = obj.controller_of(o, kind, group)
      if ref then return under(o, ref.name) end
      if not obj.controller_of(o) and adopt then return under(o, o.metadata.name) end
      right:skip(o, obj.controller_of(o) and ("its controller ownerReference is not of kind %s")
        :format(kind) or "it has no controller ownerReference")
    end })
    local out, lefts = {}, 0
    local function pair()
      local left, matches = j:next()
      if left ~= nil then lefts = lefts + 1 end
      if left == nil then -- read through: what no left object claimed, left alone
        for _, o in j:unmatched() do
          local ref = obj.controller_of(o, kind, group)
          right:skip(o, ref and ("its %s %s is gone"):format(noun, ref.name)
            or ("it has no controller ownerReference and no %s of its name"):format(noun))
        end
        return nil
      end
      local owned = {}
      for _, o in ipairs(matches) do
        local other = obj.uid_conflict(left, o)
        if other then
          right:skip(o, ("its ownerReference names uid %s but %s %s has uid %s")
            :format(other.uid, noun, other.name, left.metadata.uid), true)
        else
          owned[#owned + 1] = o
        end
      end
      return left, owned
    end
    function out.next(_) return pair() end
    -- how many right objects (of its `where`) the join read: joined:count();
    -- how many left objects it has handed out so far: joined:count("left")
    function out.count(_, which) return which == "left" and lefts or counted end
    return setmetatable(out, { __call = pair })
  end

  -- for left, matches in s.vms:join(s.vmis, { key = fn(right) }) do ... end (ctx:join);
  -- { owner = true[, adopt = true] }: joined by controller ownerReference (owner_join);
  -- nil when a side is not served, its `unserved` text said as an info finding (the
  -- join is the walk's subject: check says why there is nothing to do)
  function s.join(right, opts)
    validate.arg(2, "join(right, opts)", "opts", opts, "table")
    local ok, name, why = served()
    if not ok then return unserved(name, why, true) end
    ok, name, why = right:_served()
    if not ok then return right:_unserved(name, why, true) end
    if opts.owner then return owner_join(right, opts.adopt) end
    return ctx:join(iterate(listing(resource(), {})), right:_listing(), opts)
  end
  function s._listing() return iterate(listing(resource(), {})) end
  s._served = served
  function s._unserved(name, why, finding) unserved(name, why, finding) end
  -- An object the walk leaves alone, and why: a debug line; notable, also an
  -- info finding in check (`noun`, else the kind, names it).
  function s.skip(o, why, notable)
    local line = ("%s %s left alone: %s"):format(decl.noun or o.kind, obj.key(o), why)
    ctx.log:debug(line)
    if notable and ctx.mode == "check" then
      ctx:finding("info", (line:gsub(" left alone: ", " is left alone: ", 1)))
    end
  end
  return s
end

-- Methods of a selection are called with `:` (s.vms:each(fn)); a call with
-- `.` is refused, naming the right form.
local function methods(key, s)
  local out = {}
  for name, fn in pairs(s) do
    out[name] = function(self, ...)
      if self ~= out then
        error(("s.%s.%s: call it with ':' (s.%s:%s(...))"):format(key, name, key, name), 2)
      end
      return fn(...)
    end
  end
  return out
end

-- The outcome a selection records: its declared mapping (key = "changed",
-- "unchanged+absent", ...) or, for one that edits, every count.
local function outcome_of(decl, tally, out)
  local map = decl.outcome
  if map == nil and not decl.edit then return end
  map = map or { changed = "changed", unchanged = "unchanged", gone = "absent", failed = "failed" }
  for key, expr in pairs(map) do
    local n = 0
    for part in tostring(expr):gmatch("[^+%s]+") do n = n + (tally[part] or 0) end
    out[key] = (out[key] or 0) + n
  end
end

-- After the walk, each object a selection declaring `finding = { severity,
-- text }` selects (its where; check_only: in check alone) is that finding,
-- `{key}` in the text its namespace/name, in the order of the selections' keys.
local function declared_findings(ctx, spec, s)
  local keys = {}
  for key, decl in pairs(spec.select) do
    if decl.finding then keys[#keys + 1] = key end
  end
  table.sort(keys)
  for _, key in ipairs(keys) do
    local severity, text = spec.select[key].finding[1], spec.select[key].finding[2]
    s[key]:each(function(o)
      local k = obj.key(o)
      ctx:finding(severity, (text:gsub("{key}", function() return k end)), { name = o })
    end)
  end
end

-- The failure policies at the walk's end: "fail" raises, "leave" leaves the
-- version, naming the objects that failed.
local function settle(ctx, spec, state)
  local fields = {}
  for key, decl in pairs(spec.select) do
    local tally = state.counts[key]
    outcome_of(decl, tally, fields)
    local policy = decl.writes or "stop"
    if #tally.names > 0 and (policy == "fail" or policy == "leave") then
      local reason = (decl.failed or "%d write(s) failed: %s")
        :format(#tally.names, table.concat(tally.names, ", "))
      if policy == "fail" then state.fail = reason else state.leave = state.leave or reason end
    end
  end
  if next(fields) then ctx:outcome(fields) end
  if state.fail then error(state.fail, 0) end
  if state.leave then ctx:leave_version(state.leave) end
end

-- A rule that orchestrates (docs/engine-api.md, "Rules that orchestrate"):
-- a selection may also read one object by name (`get = true`), apply objects
-- server-side (`apply = true`) and wait for one of its objects
-- (`wait = true`); each adds the verbs it needs to the derived permissions.
local ORCHESTRATION = {
  { "get", { "get" } }, { "apply", { "get", "create", "patch" } }, { "wait", { "list", "watch" } },
}
for _, o in ipairs(ORCHESTRATION) do FIELDS[o[1]] = "boolean" end

-- The permissions the orchestration fields of a selection add to out (not
-- those already there), scoped to its namespace when it names one object.
local function orchestration_permissions(decl, out)
  local seen = {}
  local function id(p)
    return table.concat({ p.verb, p.group, p.resource, p.namespace or "", p.name or "" }, " ")
  end
  for _, p in ipairs(out) do seen[id(p)] = true end
  for _, o in ipairs(ORCHESTRATION) do
    local field, verbs = o[1], o[2]
    for _, resource in ipairs(decl[field] and decl or {}) do
      local plural, group = recipe.resource_name(resource)
      for _, verb in ipairs(verbs) do
        local p = { verb = verb, group = group, resource = plural,
          namespace = decl.name and decl.namespace or nil, check_only = decl.check_only or nil }
        if not seen[id(p)] then seen[id(p)], out[#out + 1] = true, p end
      end
    end
  end
end

-- get, apply and wait of selection key: on its (first) resource, and only
-- when declared (the permissions come from the declaration).
local function orchestration_methods(ctx, key, decl, s)
  local res
  local function resource(what)
    if not decl[what] then
      error(("s.%s:%s: declare %s = true in select.%s"):format(key, what, what, key), 3)
    end
    if res == nil then
      local why
      res, why = ctx.kube:lookup(decl[1])
      if res == nil then error(("%s is not served (%s)"):format(decl[1], tostring(why)), 0) end
    end
    return res
  end
  -- the object name (in namespace, for a namespaced resource), or nil
  function s.get(name, namespace)
    local r = resource("get")
    if namespace == nil then return r:find(name) end
    return r:find(namespace, name)
  end
  -- server-side apply (opts: field_manager, force): the object as stored
  function s.apply(object, opts) return resource("apply"):apply(object, opts) end
  -- until object name (opts.namespace) meets opts.condition (rule.conditions)
  -- or is deleted or created, within opts.timeout: cozy.kube.wait. With
  -- timed_out = "warn" a wait that times out is a warning (`rollout status
  -- || true`) and returns nil, { met = false }; a stop still raises.
  function s.wait(name, opts)
    local r, o = resource("wait"), {}
    for k, v in pairs(opts or {}) do o[k] = v end
    local warn = o.timed_out == "warn"
    o.timed_out = nil
    local ok, got, info = pcall(function()
      if o.namespace then return r:wait(o.namespace, name, o) end
      return r:wait(name, o)
    end)
    if ok then return got, info end
    if not (warn and errors.is(got, "migration") and got.waited) then error(got, 0) end
    ctx.log:warn(tostring(got.message))
    return nil, { met = false, waited = got.waited }
  end
  return s
end

-- A tool's declaration as the migration table holds it: name -> its access
-- lines (cozy.runner.tools: what it may do on the cluster, which no selection
-- can say), so that the generated RBAC, `list` and `check` show it.
local function checked_tools(tools)
  local why = validate.why("tools", tools, "table", { optional = true,
    says = "name -> its access lines, { [\"etcd-migrate\"] = { \"get,list pods\" } }" })
  if why then refuse("%s", why) end
  for name, access in pairs(tools or {}) do
    if type(name) ~= "string" or type(access) ~= "table" then
      refuse("tools: a tool is declared with what it may do on the cluster: "
        .. "tools = { [\"%s\"] = { \"VERBS RESOURCE [-n NAMESPACE]\", ... } }",
        type(name) == "string" and name or tostring(access))
    end
  end
  return tools
end

---@class cozy.RuleSpec
---@field description string one line
---@field select? table<string, table> the selections, by name (docs/engine-api.md, "Rules")
---@field walk fun(ctx: cozy.Ctx, s: table) run, plan and check alike
---@field timeout? number seconds
---@field tools? table<string, string[]> name -> its access lines ("get,list pods")
---@field parameters? table[] its inputs (docs/engine-api.md, "Parameters")
---@field files? table<string, string> read-only paths (docs/engine-api.md, "Files")
---@field finally? fun(ctx: cozy.Ctx, s: table) the compensation, with fresh selections

--- The migration table of a rule: description, timeout, the permissions its
--- selections need, and its walk (run, plan and check alike); its tools,
--- parameters, files and finally passed through (finally gets selections too).
---@param spec cozy.RuleSpec
---@return table migration the table discovery takes (description, permissions, walk, timeout)
function rule.define(spec)
  if type(spec) ~= "table" then refuse("rule{...}: expected a table, got %s", type(spec)) end
  for k in pairs(spec) do
    if not RULE_FIELDS[k] then refuse("unknown field %q (a rule has description, select, walk,"
      .. " timeout, tools, parameters, files, finally)", tostring(k)) end
  end
  for _, field in ipairs { { "select", "table", "a table of named selections" },
    { "walk", "function", "a function(ctx, s)" },
    { "finally", "function", "a function(ctx, s)", true } } do
    local why = validate.why(field[1], spec[field[1]], field[2],
      { says = field[3], optional = field[4] })
    if why then refuse("%s", why) end
  end
  local permissions, keys = {}, {}
  for key in pairs(spec.select) do keys[#keys + 1] = key end
  table.sort(keys)
  for _, key in ipairs(keys) do
    check_selection(key, spec.select[key])
    permissions_of(key, spec.select[key], permissions)
    orchestration_permissions(spec.select[key], permissions)
  end
  -- a read may leave the version (reads = "leave"): only then is the walk
  -- run under pcall (elsewhere an error keeps the traceback of where it was raised)
  local may_leave = false
  for _, key in ipairs(keys) do may_leave = may_leave or spec.select[key].reads == "leave" end
  local function selections(ctx, state)
    local s = {}
    for _, key in ipairs(keys) do
      s[key] = methods(key, orchestration_methods(ctx, key, spec.select[key],
        selection(ctx, key, spec.select[key], state)))
    end
    return s
  end
  local function walk(ctx)
    local state = { counts = {} }
    local s = selections(ctx, state)
    if may_leave then
      local ok, err = pcall(spec.walk, ctx, s)
      if not ok and err ~= LEAVE then error(err, 0) end
    else
      spec.walk(ctx, s)
    end
    declared_findings(ctx, spec, s)
    settle(ctx, spec, state)
  end
  -- run and check are the walk (discovery: a rule's three are one function)
  -- finally: selections of its own (its counts are not the walk's)
  local finally = spec.finally and function(ctx)
    return spec.finally(ctx, selections(ctx, { counts = {} }))
  end
  return { description = spec.description, timeout = spec.timeout, permissions = permissions,
    walk = walk, run = walk, check = walk, tools = checked_tools(spec.tools),
    parameters = spec.parameters, files = spec.files, finally = finally }
end

-- A declared text said as it is (ctx.log:change formats its template).
local function literal(text) return (text:gsub("%%", "%%%%")) end

---@class cozy.DeleteRule
---@field [1] string the resource, as select's
---@field namespace? string
---@field name string
---@field description string
---@field timeout? number
---@field unless? table a selection that keeps the object while it lists any
---@field absent? string said when the object is absent
---@field kept? string said when `unless` keeps it
---@field deleting? string said when it is deleted ({run|plan} wording)

--- A canned rule: delete one object if it is there, as `kubectl delete
--- <resource> <name> --namespace <ns> --ignore-not-found`; check lists the
--- delete only when there is something to delete. `unless` is a selection
--- (as in select) that keeps the object while it lists any object; `absent`,
--- `kept` and `deleting` are the lines said when the object is absent, kept,
--- or deleted (a `{run|plan}` wording).
---   return rule.delete { "deployments.apps", namespace = "ns", name = "x", description = "..." }
---@param spec cozy.DeleteRule
---@return table migration
function rule.delete(spec)
  if type(spec) ~= "table" then refuse("delete{...}: expected a table, got %s", type(spec)) end
  for _, field in ipairs { "absent", "kept", "deleting" } do
    local why = validate.why("delete." .. field, spec[field], "string", true)
    if why then refuse("%s", why) end
  end
  local where = ("%s/%s"):format(tostring(spec.namespace), tostring(spec.name))
  return rule.define {
    description = spec.description, timeout = spec.timeout,
    select = { object = { spec[1], namespace = spec.namespace, name = spec.name, delete = true },
      unless = spec.unless },
    walk = function(ctx, s)
      local found = s.object:find()
      if found == nil then
        return ctx.log:info(spec.absent
          or ("%s %s absent: nothing to delete"):format(spec[1], where))
      end
      if s.unless and s.unless:first() then
        return ctx.log:info(spec.kept or ("%s %s kept: %s still lists objects")
          :format(spec[1], where, spec.unless[1]))
      end
      ctx.log:change(spec.deleting and literal(spec.deleting)
        or ("{Deleting|Would delete} %s %s"):format(found.kind or spec[1], where))
      s.object:delete(found)
    end,
  }
end

-- The ready-made conditions of a selection's wait (docs/engine-api.md,
-- "Waiting for a condition"): established, rolled_out, alt_names { names },
-- condition(type [, status]).
rule.conditions = require("cozy.kube.wait").conditions()

-- Orphans one object: `suspend` (a merge patch: its controller stops acting on
-- it), its finalizers removed, read back to see that none came back (else the
-- step stops: a delete now would run the finalizer), deleted. "gone" when it
-- was deleted by someone else before its finalizers were removed; else
-- "orphaned", gone or not (with no finalizer left, a deleted object goes at once).
local function orphan_one(objects, o, spec)
  if spec.suspend and objects:merge_patch(o, spec.suspend) == nil then return "gone" end
  local patched = objects:merge_patch(o, { metadata = { finalizers = json.null } })
  if patched == nil then return "gone" end
  -- what the controller would see on delete (in a plan, what the patch would have left)
  local current = objects:read_back(patched)
  if current == nil then return "orphaned" end
  local left = obj.list(current, "metadata.finalizers")
  if #left > 0 then
    error((spec.readded or "%s %s still has finalizers [%s] after they were removed: something"
      .. " re-added them; deleting it now would run them, so it stops here"):format(o.kind,
      obj.key(o), table.concat(left, ", ")), 0)
  end
  objects:delete(o) -- without waiting: with no finalizer the object goes at once
  return "orphaned"
end

---@class cozy.OrphanRule
---@field [1] string the resource, as select's
---@field description string
---@field timeout? number
---@field where? table|function which objects, as a selection's `where`
---@field suspend? table the merge patch sent first
---@field noun? string what the objects are called in lines and findings
---@field fields? table<string, string> name = dotted path, logged and reported with each
---@field project? string[] more paths to read
---@field unserved? string said when the resource is not served, as a selection's
---@field readded? string the error when a finalizer is back: kind, name, finalizers
---@field deleting? string why an object already being deleted matters

--- A canned rule: orphan the objects of a resource (those its `where` passes)
--- without running their finalizers: per object, in this order, `suspend` (a
--- merge patch, optional), finalizers removed, read back (one re-added stops
--- the step before the delete: the `readded` text, with the kind, the name and
--- the finalizers), deleted. Check lists each object it would orphan (an info
--- finding; a warning when it is already being deleted, `deleting` saying
--- why that matters); run and plan say each, then the summary, and record
--- `{ orphaned, gone }`. `noun` names the objects in lines and findings,
--- `fields` (name = dotted path) are logged and reported with each.
---   return rule.orphan { "helmreleases.helm.toolkit.fluxcd.io", where = { ["spec.chart"] = "x" },
---     suspend = { spec = { suspend = true } }, noun = "HelmRelease", description = "..." }
---@param spec cozy.OrphanRule
---@return table migration
function rule.orphan(spec)
  if type(spec) ~= "table" then refuse("orphan{...}: expected a table, got %s", type(spec)) end
  for _, field in ipairs { { "noun", "string" }, { "readded", "string" },
    { "deleting", "string" }, { "suspend", "table" }, { "fields", "table" } } do
    local why = validate.why("orphan." .. field[1], spec[field[1]], field[2], true)
    if why then refuse("%s", why) end
  end
  local noun, fields = spec.noun or spec[1], spec.fields or {}
  local project = { "metadata.deletionTimestamp" }
  for _, path in pairs(fields) do project[#project + 1] = path end
  for _, path in ipairs(spec.project or {}) do project[#project + 1] = path end
  return rule.define {
    description = spec.description, timeout = spec.timeout,
    select = { objects = { spec[1], patch = true, delete = true, project = project,
      where = spec.where, unserved = spec.unserved } },
    walk = function(ctx, s)
      local counts = { orphaned = 0, gone = 0 }
      s.objects:each(function(o)
        local said = {}
        for name, path in pairs(fields) do said[name] = obj.get(o, path) end
        if ctx.mode == "check" then
          said.name = o
          ctx:finding("info", ("would orphan %s %s"):format(noun, obj.key(o)), said)
          local since = obj.get(o, "metadata.deletionTimestamp")
          if since then
            ctx:finding("warn", ("%s %s is already being deleted (deletionTimestamp %s)%s")
              :format(o.kind, obj.key(o), since, spec.deleting and (": " .. spec.deleting) or ""),
              { name = o })
          end
          return
        end
        ctx.log:with(said):change("{Orphaning|Would orphan} %s %s", noun, obj.key(o))
        local result = orphan_one(s.objects, o, spec)
        counts[result] = counts[result] + 1
        if result == "gone" then
          ctx.log:info(("%s %s was deleted meanwhile: nothing to orphan")
            :format(o.kind, obj.key(o)))
        end
      end)
      if ctx.mode == "check" then return end
      ctx:outcome(counts)
      ctx.log:change("{Orphaned|Would orphan} %d %s(s), %d already gone", counts.orphaned,
        noun, counts.gone)
    end,
  }
end

return setmetatable(rule, { __call = function(_, spec) return rule.define(spec) end })
