---@meta
-- LuaCATS definitions (as lua-language-server reads them) of the `ctx` a
-- migration's run(ctx), check(ctx) and walk(ctx) receive, and of the tables
-- it hands out: ctx.kube, its resources and pagers, ctx.log, progress bars,
-- joins and queues (docs/engine-api.md, "The migration context `ctx`").
-- They are built as sealed tables of closures in scripts/cozy/runner/context.lua,
-- which an editor cannot follow; this file is what it completes from. It is
-- never loaded by the engine. spec/unit/annotations_spec.lua builds a ctx as
-- the runner does and fails when one of its fields is not declared here.
--
-- In a migration: `---@param ctx cozy.Ctx` above run, check or walk.

---@class cozy.Ctx the context of one step
---@field kube cozy.Kube the client, as this step may use it
---@field log cozy.Log a logger tagged with the migration
---@field namespace string the engine's namespace (cozy-system by default)
---@field from integer this step moves version `from` ...
---@field to integer ... to version `to`
---@field mode "run"|"plan"|"check"
---@field findings cozy.Finding[] a read-only copy of the findings so far
---@field params table<string, string|nil> the declared parameters' values, read-only (nil: unset, no default)
---@field files cozy.Files the declared read-only files
local Ctx = {}

---@class cozy.ToolOptions
---@field dry_run? boolean this invocation is the tool's own dry run: it runs in plan and check too
---@field capture? boolean return its stdout (at most 1 MiB)
---@field allow_failure? boolean a non-zero exit is returned, not raised
---@field kubeconfig_flag? string "--kubeconfig" or "--kubeconfig=": the step's kubeconfig path in argv

---@class cozy.ToolResult
---@field status integer its exit status (0 unless allow_failure)
---@field stdout? string with capture = true
---@field truncated? boolean stdout was cut at 1 MiB

--- Runs a tool the migration table declares (`tools = { [name] = { access } }`), with an
--- argument vector (no shell), the step's kubeconfig, in its own process group
--- under the step's time limit; its output logged line by line, redacted.
---@param name string a name of the table's `tools`
---@param argv? string[]
---@param opts? cozy.ToolOptions
---@return cozy.ToolResult
function Ctx:tool(name, argv, opts) end

---@class cozy.Files the paths the migration table's `files` declares, read-only
local Files = {}

--- The file's text: the declared path itself, or `relative` under it.
---@param key string a key of the table's `files`
---@param relative? string a relative name under a declared directory (no `..`)
---@return string
function Files:read(key, relative) end

--- The file decoded as JSON (cozy.json: integers exact, json.null).
---@param key string
---@param relative? string
---@return any
function Files:json(key, relative) end

--- The sorted names of the regular files directly in a declared directory.
---@param key string
---@param suffix? string only names ending in it (".json")
---@return string[]
function Files:list(key, suffix) end

--- "file", "directory", ... or nil when nothing is there.
---@param key string
---@param relative? string
---@return string|nil
function Files:exists(key, relative) end

---@alias cozy.WaitCondition fun(obj: cozy.Object|nil): boolean, string?, boolean?|string|{ type: string, status?: string }

---@class cozy.WaitOptions
---@field condition? cozy.WaitCondition met when it returns true (why: logged; fatal: ends the wait, failed)
---@field deleted? boolean wait until the object is gone
---@field created? boolean wait until the object exists
---@field namespace? string for ctx.kube:wait of a namespaced resource
---@field timeout? number seconds (default 300)
---@field what? string words a function condition for the log

---@class cozy.WaitInfo
---@field met boolean
---@field waited number seconds
---@field events integer watch events judged
---@field relists integer lists after a watch ended
---@field once boolean read once, not waited (check, dry runs)

---@class cozy.Conditions the ready-made wait conditions
---@field established cozy.WaitCondition a CRD's Established is True
---@field rolled_out cozy.WaitCondition a Deployment rolled out, by kubectl rollout status's rule
---@field alt_names fun(names: string[]): cozy.WaitCondition a cert-manager Secret issued with exactly these SANs
---@field condition fun(type: string, status?: string): cozy.WaitCondition status.conditions[type].status

---@class cozy.Finding
---@field severity "info"|"warn"|"block"
---@field message string
---@field fields? table<string, any>

--- A finding: in check, one of the step's findings; in run and plan a log
--- line at its severity ("block": ERROR), and a "block" stops the step before
--- its next write. A field whose value is an object keeps the object's name
--- (and gives the finding its namespace).
---@param severity "info"|"warn"|"block"
---@param message string
---@param fields? table<string, any>
function Ctx:finding(severity, message, fields) end

--- What the step did, for its history record (numbers, short strings,
--- booleans; later calls add and overwrite keys). Returns fields.
---@param fields table<string, number|string|boolean>
---@return table<string, number|string|boolean> fields
function Ctx:outcome(fields) end

--- Some items failed: leave the version for the next upgrade (the step still
--- returns normally; the last reason is the one recorded).
---@param reason string what is left to do
function Ctx:leave_version(reason) end

--- A text worded for the mode: "{updated|would update}" (run | plan, check).
---@param template string
---@return string
function Ctx:worded(template) end

--- A keyed join of two lists, held as JSON text: for left_item, matches in ctx:join(...) do.
---@param left any[]|cozy.Pager|fun(): any
---@param right any[]|cozy.Pager|fun(): any
---@param opts { key: fun(right_item: any): any, left_key?: fun(left_item: any): any }
---@return cozy.Join
function Ctx:join(left, right, opts) end

--- A first-in first-out queue of (object, value) pairs, held as JSON text.
---@return cozy.Queue
function Ctx:queue() end

--- A progress bar (shorthand for ctx.log:progress).
---@param label string
---@param total integer
---@return cozy.Progress
function Ctx:progress(label, total) end

---@class cozy.Kube the client of a step: every request passes its gate
---@field namespace? string the kubeconfig context's or service account's namespace
---@field server string the API server's URL
---@field stats { requests: integer, writes: integer, retries: integer, conflicts: integer } live, read-only
---@field conditions cozy.Conditions ready-made conditions for wait
local Kube = {}

--- Waits until object `name` meets opts.condition, is deleted or is created,
--- by a list and then watches (relisted where one ends), within opts.timeout
--- and the step's limit; a timeout raises kind `migration`.
---@param resource cozy.Resource|string a resource of ctx.kube, or a name as kubectl takes it
---@param name string
---@param opts? cozy.WaitOptions
---@return cozy.Object|nil obj, cozy.WaitInfo info
function Kube:wait(resource, name, opts) end

--- A resource by API version and plural.
---@param api_version string "v1", "apps/v1", ...
---@param plural string
---@param opts? { namespaced?: boolean, kind?: string } namespaced defaults to true
---@return cozy.Resource
function Kube:resource(api_version, plural, opts) end

--- A resource as kubectl names it ("pvc", "deployments.apps"), resolved from
--- discovery, and what discovery says of it; nil and why when not served.
---@param name string
---@return cozy.Resource|nil resource
---@return table|string about discovery's entry, or why it is not served
function Kube:lookup(name) end

--- The resources of an API group ("" the core group), as
--- `kubectl api-resources --api-group` lists them; nil and why when not served.
---@param group string
---@return table[]|nil resources
---@return string|nil why
function Kube:api_resources(group) end

--- Whether the server serves plural at api_version (discovery, cached).
---@param api_version string
---@param plural string
---@return boolean
function Kube:served(api_version, plural) end

--- update_each over every object of a resource named as kubectl names it:
--- the list's options and update_each's together in opts. Not served: an
--- info line, and nil and why.
---@param name string
---@param edit fun(copy: cozy.Object, item: cozy.Object, value: any): any
---@param opts? table list options (namespace, label_selector, ...) and update_each's
---@return table|nil counts { changed, unchanged, absent, failed }
---@return table|string failures, or why the resource is not served
function Kube:update_all(name, edit, opts) end

--- Whether v is an API error of one request (what a best-effort loop logs and goes on from).
---@param v any
---@return boolean
function Kube:is_item_error(v) end

--- One request to any path (its permission still checked).
---@param method string "GET", "POST", "PATCH", ...
---@param path string
---@param spec? { query?: string[][], body?: any, content_type?: string, timeout?: number, retry?: cozy.RetryBudget }
---@return any answer the decoded body
function Kube:call(method, path, spec) end

--- GET any API path (e.g. "/version"), decoded.
---@param path string
---@param query? string[][]
---@return any
function Kube:get_path(path, query) end

---@class cozy.RetryBudget a budget that only lowers the engine's retry bounds
---@field attempts? integer
---@field time? number seconds
---@field batch_retries? integer
---@field batch_time? number seconds

---@alias cozy.Absent { absent?: "skip"|"fail", retry?: cozy.RetryBudget }

---@class cozy.Resource a resource of ctx.kube; namespaced ones take (namespace, name), cluster-scoped ones (name)
---@field api_version string
---@field plural string
---@field namespaced boolean
---@field kind? string
local Resource = {}

--- Waits until object `name` meets opts.condition, is deleted or is created
--- (as ctx.kube:wait; cluster-scoped: wait(name, opts)).
---@param namespace string|nil
---@param name string
---@param opts? cozy.WaitOptions
---@return cozy.Object|nil obj, cozy.WaitInfo info
function Resource:wait(namespace, name, opts) end

--- The object; raises when absent (opts.absent = "skip": nil).
---@param namespace string|nil
---@param name string
---@param opts? cozy.Absent
---@return cozy.Object|nil
function Resource:get(namespace, name, opts) end

--- The object, or nil when the object is absent (an absent resource type still raises).
---@param namespace string|nil
---@param name string
---@param opts? { retry?: cozy.RetryBudget }
---@return cozy.Object|nil
function Resource:find(namespace, name, opts) end

--- Creates obj (its namespace from obj.metadata.namespace): the created
--- object and true; with opts.exists = "skip" an object of that name that
--- exists already is returned as it is, with false.
---@param obj cozy.Object
---@param opts? { exists?: "skip"|"fail", retry?: cozy.RetryBudget }
---@return cozy.Object object
---@return boolean created
function Resource:create(obj, opts) end

--- Server-side apply (application/apply-patch+yaml): the fields obj sets
--- are owned by field_manager; the object is created when absent. A field
--- another manager owns is a 409 conflict unless force.
---@param obj cozy.Object apiVersion, kind and metadata.name (and namespace) included
---@param opts { field_manager: string, force?: boolean, retry?: cozy.RetryBudget }
---@return cozy.Object object as stored (or as a dry run would store it)
function Resource:apply(obj, opts) end

--- An RFC 7386 merge patch.
---@param namespace string|nil
---@param name string
---@param patch table
---@param opts? cozy.Absent
---@return cozy.Object|nil
function Resource:merge_patch(namespace, name, patch, opts) end

--- An RFC 6902 JSON patch.
---@param namespace string|nil
---@param name string
---@param ops table[] { op =, path =, value = } operations
---@param opts? cozy.Absent
---@return cozy.Object|nil
function Resource:json_patch(namespace, name, ops, opts) end

--- Deletes the object; raises when absent (opts.absent = "skip": nil).
---@param namespace string|nil
---@param name string
---@param opts? cozy.Absent
function Resource:delete(namespace, name, opts) end

--- A conflict-aware update: mutate(obj) returns JSON patch ops, or nil for
--- no change; the engine guards, sends and retries on conflicts. Also
--- update(obj_held, mutate[, opts]).
---@param namespace string|nil|cozy.Object
---@param name string|fun(obj: cozy.Object): table[]|nil
---@param mutate? fun(obj: cozy.Object): table[]|nil
---@param opts? cozy.Absent
---@return cozy.Object|nil object
---@return boolean changed
function Resource:update(namespace, name, mutate, opts) end

--- Edits a copy and writes the difference (guarded): edit(copy) changes the
--- copy in place. Also change(obj_held, edit[, opts]).
---@param namespace string|nil|cozy.Object
---@param name string|fun(copy: cozy.Object): any
---@param edit? fun(copy: cozy.Object): any
---@param opts? cozy.Absent
---@return cozy.Object|nil object
---@return boolean changed
function Resource:change(namespace, name, edit, opts) end

--- A batch of changes, one per item (an array, a list or a function
--- returning the next item and a value), with the step's progress, a line
--- per item deleted since the list and a warning per failure.
---@param items any[]|cozy.Pager|fun(): any, any
---@param edit fun(copy: cozy.Object, item: cozy.Object, value: any): any
---@param opts? table concurrency, absent, on_error, project, retry, label, total, summary, describe, on_change, on_absent, on_failure
---@return table counts { changed, unchanged, absent, failed }
---@return table failures
function Resource:update_each(items, edit, opts) end

--- The object a write returned, as stored now (a fresh read; nil when gone);
--- in a dry run the write's own answer.
---@param written cozy.Object
---@return cozy.Object|nil
function Resource:read_back(written) end

--- The API path of an object.
---@param namespace string|nil
---@param name string
---@return string
function Resource:path(namespace, name) end

--- The API path of the collection (a namespace's, or all).
---@param namespace? string
---@return string
function Resource:collection_path(namespace) end

--- The objects, paged (limit per page, continue tokens hidden): for obj in res:list{...} do.
---@param opts? cozy.ListOptions
---@return cozy.Pager
function Resource:list(opts) end

---@class cozy.ListOptions
---@field namespace? string nil: all namespaces
---@field label_selector? string
---@field field_selector? string
---@field limit? integer a page's size (default 500)
---@field project? string[]|fun(obj: cozy.Object): any dotted paths to keep, or a function of each object
---@field retry? cozy.RetryBudget
---@field on_restart? fun(pager: cozy.Pager) called when the list restarts (an expired continue token)

---@class cozy.Pager a list being read; calling it returns the next object
---@field pages integer
---@field count integer
---@field restarts integer
---@field skipped integer
---@field resource_version? string
---@overload fun(): cozy.Object|nil
local Pager = {}

--- The next object, or nil at the end.
---@return cozy.Object|nil
function Pager:next() end

--- All remaining objects.
---@return cozy.Object[]
function Pager:collect() end

---@class cozy.Log a logger tagged with the migration
local Log = {}

--- A change, worded for the mode: log:change("VM %s: {adding|would add} %s", key, what).
---@param template string
---@param ... any format arguments
function Log:change(template, ...) end

--- An info line.
---@param message string
---@param fields? table<string, any>
function Log:info(message, fields) end

--- A warning line (kept in the step's outcome).
---@param message string
---@param fields? table<string, any>
function Log:warn(message, fields) end

--- An error line (kept in the step's outcome); the step goes on.
---@param message string
---@param fields? table<string, any>
function Log:error(message, fields) end

--- A debug line (-v).
---@param message string
---@param fields? table<string, any>
function Log:debug(message, fields) end

--- Whether lines of this level are written.
---@param level "debug"|"info"|"warn"|"error"
---@return boolean
function Log:enabled(level) end

--- A progress bar.
---@param label string
---@param total integer
---@return cozy.Progress
function Log:progress(label, total) end

--- A logger whose lines carry tags too.
---@param tags table<string, any>
---@return cozy.Log
function Log:with(tags) end

---@class cozy.Progress
local Progress = {}

--- Counts n more done (default 1).
---@param n? integer
function Progress:step(n) end

--- Ends the bar.
function Progress:done() end

---@class cozy.Queue
local Queue = {}

--- Queues an object and a value (held as JSON text).
---@param o cozy.Object
---@param value? any
function Queue:push(o, value) end

--- The first object and its value, or nil when empty.
---@return cozy.Object|nil object
---@return any value
function Queue:pop() end

--- How many are queued.
---@return integer
function Queue:len() end

--- An iterator popping each: for o, value in q:drain() do.
---@return fun(): cozy.Object|nil, any
function Queue:drain() end

---@class cozy.Join calling it returns the next left item and its matches
---@overload fun(): any, any[]
local Join = {}

--- The next left item and its matches (an array), or nil at the end.
---@return any left_item
---@return any[] matches
function Join:next() end

--- An iterator over the right items no left item claimed.
---@return fun(): any
function Join:unmatched() end

---@class cozy.Selection one declared selection of a rule (docs/engine-api.md, "Rules"): s.name
local Selection = {}

--- The one iteration: fn for every object of the selection (its `where` passing). Edited
--- (edit = true): fn(copy, item, value) edits the copy and returns whether it changed it,
--- or false and why to refuse the object (the `refused` warning); read: fn(object).
---@param fn fun(o: any, item?: any, value?: any): any, string?
---@param opts? { namespace?: string, label_selector?: string, items?: any, label?: string }
---@return cozy.EachCounts|nil
function Selection:each(fn, opts) end

---@class cozy.EachCounts what one `each` pass did
---@field changed integer
---@field unchanged integer
---@field absent integer
---@field failed integer
---@field landed any[] what each edit that landed returned
local EachCounts = {}

--- That field of each edit that landed, added: an array by its length, a number as it is.
---@param field string
---@return integer
function EachCounts:sum(field) end

--- Every resource of the selection served: true, or false, the first one not served and why.
---@return boolean served
---@return string? resource
---@return any why
function Selection:served() end

--- The one object a named selection declares, or nil.
---@return any|nil
function Selection:find() end

--- The first object listed (label_selector, namespace), or nil.
---@param opts? { namespace?: string }
---@return any|nil
function Selection:first(opts) end

--- A merge patch of an object held: the patched object, or nil when it is gone.
---@param o any
---@param changes table
---@return any|nil
function Selection:merge_patch(o, changes) end

--- Deletes an object held (one gone already is done).
---@param o any
function Selection:delete(o) end

--- The object a write returned, as stored now (a plan: the write's answer).
---@param written any
---@return any|nil
function Selection:read_back(written) end

--- The selection joined with another: for left, matches in s.x:join(s.y, opts) do; nil
--- when a side is not served (its `unserved` text said as an info finding). By key, or
--- by owner ({ owner = true, adopt? = true }: controller ownerReference and uid).
---@param right cozy.Selection
---@param opts { key?: fun(right_item: any): any, left_key?: fun(left_item: any): any, owner?: boolean, adopt?: boolean }
---@return cozy.Join|cozy.OwnerJoin|nil
function Selection:join(right, opts) end

--- An object the walk leaves alone: a debug line naming it and why; notable, also an
--- info finding in check.
---@param o any
---@param why string
---@param notable? boolean
function Selection:skip(o, why, notable) end

--- The object name (in namespace, for a namespaced resource), or nil (get = true).
---@param name string
---@param namespace? string
---@return any|nil
function Selection:get(name, namespace) end

--- Server-side apply of object (apply = true): the object as stored.
---@param object table
---@param opts? { field_manager?: string, force?: boolean }
---@return any
function Selection:apply(object, opts) end

--- Waits until object name meets opts.condition (rule.conditions), or is deleted or
--- created, within opts.timeout (wait = true); timed_out = "warn": nil, { met = false }.
---@param name string
---@param opts? { namespace?: string, condition?: any, deleted?: boolean, created?: boolean, timeout?: number, timed_out?: "warn" }
---@return any|nil object
---@return table info { met, waited, ... }
function Selection:wait(name, opts) end

--- Engine use (join): the selection's list.
---@return cozy.Pager
function Selection:_listing() end

--- Engine use (join): as served.
---@return boolean served
function Selection:_served() end

--- Engine use (join): says the selection's `unserved` text.
---@param name string
---@param why any
---@param finding? boolean
function Selection:_unserved(name, why, finding) end

---@class cozy.OwnerJoin a join by owner: calling it returns the next left item and what it owns
---@overload fun(): any, any[]
local OwnerJoin = {}

--- The next left item and the right items it owns (an array), or nil at the end.
---@return any left_item
---@return any[] owned
function OwnerJoin:next() end

--- How many right items (those its `where` passes) the join read; with "left", how
--- many left items it has handed out so far.
---@param which? "left"|"right"
---@return integer
function OwnerJoin:count(which) end
