-- Batches: update_each, a resource's many independent changes, driven by
-- the update engine's one scheduler (cozy.kube.update) with up to
-- `concurrency` in flight; concurrency 1 is the serial path.
local budget = require "cozy.kube.budget"
local errors = require "cozy.kube.errors"
local projection = require "cozy.kube.projection"
local update = require "cozy.kube.update"
local validate = require "cozy.validate"

local batch = {}

-- update_each's argument checks; returns pull (the next item and its
-- value, nil: no more) and the projection tree of opts.project.
local function each_args(items, edit, opts)
  local pull = items
  -- a list's pager before the empty array: the one a migration holds is a
  -- sealed proxy (cozy.sandbox), raw-empty, its methods behind __index
  if type(items) == "table" and items[1] == nil and type(items.next) == "function" then
    pull = function() return items:next() end -- a list's pager, read as the batch goes
  elseif type(items) == "table" and (items[1] ~= nil or next(items) == nil) then
    local i = 0
    pull = function() i = i + 1 return items[i] end
  else
    validate.arg(3, "update_each(items, edit, opts)", "items", items, "function",
      { says = "an array, a list or a function returning the next item" })
  end
  validate.args(3, "update_each", {
    { "edit", edit, "function" },
    { "opts.absent", opts.absent, { one_of = { "skip", "fail" } }, true },
    { "opts.on_error", opts.on_error, { one_of = { "stop", "continue" } }, true },
    { "opts.project", opts.project, "table",
      { optional = true, says = "an array of dotted paths" } },
  })
  return pull, opts.project and projection.new(opts.project)
end

-- A batch of independent changes: change(item, edit) for each item (an
-- object), in no promised order (the items must not depend on each other).
-- items is an array; a list (a pager: its objects as they are read); or a
-- function returning the next item (nil: no more) and, optionally, a value
-- carried with it: edit(copy, item, value), and on_change and on_absent
-- after, are handed that value with the item, in every path (parallel,
-- serial, client dry run). The last two are pulled
-- only as the batch has room, so not all items need be held at once. opts:
--   absent = "skip"      an object deleted since the list is counted and
--                        skipped (on_absent(item, value) is told); else it raises
--   on_change(item, info, obj, value)  after each change that landed (or, in a
--                        client dry run, was recorded)
--   progress             an object with step(n), stepped after each item
--   project              dotted paths, as list's: the items are lean objects of
--                        that projection, and so are the re-reads after a
--                        conflict and the objects on_change is handed
--   on_error = "stop"    (the default) the first failure stops the batch: no
--                        change starts after it, those in flight end, then it
--                        is raised
--   on_error = "continue"  an item's API error (errors.is_item_error: not a
--                        stop) is counted in `failed` and the batch goes on;
--                        anything else (a stop, a lost lock, a denied request,
--                        an error of edit's own) still stops it
--   retry                a retry budget (cozy.kube.budget): { attempts =, time = }
--                        for each request, batch_retries = the retries all of
--                        them may make together, batch_time = no retry after it
--   on_failure(item, value, failure)  told of each item that failed with an
--                        API error, under either policy (before the stop)
-- Returns { total =, changed =, unchanged =, absent = } (and failed = with
-- on_error = "continue") and the failures: an array of { namespace =, name =,
-- kind =, code =, reason =, message = }, one per item that failed.
function batch.update_each(self, items, edit, opts)
  opts = opts or {}
  local pull, lean = each_args(items, edit, opts)
  -- every request of the batch (reads, re-reads, writes) under its budget
  local b = budget.new(opts.retry, true, 2)
  if b then self = setmetatable({ client = self.client:with_budget(b) }, { __index = self }) end
  local counts = { total = 0, changed = 0, unchanged = 0, absent = 0 }
  -- the next change, of an item that must be an object naming itself
  local function next_change()
    local item, value = pull()
    if item == nil then return nil end
    if not self:_names_itself(item) then
      error(("update_each: an item is not an object whose metadata names it (got %s)")
        :format(type(item)), 0)
    end
    counts.total = counts.total + 1
    return update.new { resource = self, ns = item.metadata.namespace, name = item.metadata.name,
      obj = item, lean = lean, item = item, value = value,
      compute = update.editing(function(copy) return edit(copy, item, value) end) }
  end
  local go_on = opts.on_error == "continue"
  if go_on then counts.failed = 0 end
  local failures = {}
  -- an item that failed with an API error: kept (plain data) and told
  local function failed(ch)
    local e = ch.err
    local f = { namespace = ch.ns, name = ch.name, kind = "api", code = e.code, reason = e.reason,
      message = e.message }
    failures[#failures + 1] = f
    if opts.on_failure then opts.on_failure(ch.item, ch.value, f) end
  end
  local done = 0
  local function ended(ch)
    done = done + 1
    if opts.progress then opts.progress:step(done) end
    if ch.state == "done" and ch.changed then
      counts.changed = counts.changed + 1
      if opts.on_change then opts.on_change(ch.item, ch.info, ch.result, ch.value) end
    elseif ch.state == "done" then
      counts.unchanged = counts.unchanged + 1
    elseif ch.state == "absent" and opts.absent == "skip" then
      counts.absent = counts.absent + 1
      if opts.on_absent then opts.on_absent(ch.item, ch.value) end
    elseif errors.is_item_error(ch.err) then
      failed(ch)
      if not go_on then error(ch.err, 0) end
      counts.failed = counts.failed + 1
    else
      error(ch.err, 0)
    end
  end
  local concurrency = math.tointeger(opts.concurrency) or self.client.concurrency
  update.run(self.client, next_change, math.max(1, math.min(64, concurrency)), ended)
  return counts, failures
end

return batch
