-- cozy.log: the engine's logger. One line per event on a stream (stderr by
-- default): "text" for people, "json" (one object per line) for log
-- collectors. A logger can be tagged (`log:with{migration = 59}`): the tags
-- are added to every line it writes, so a migration's lines say whose they are.
local json = require "cozy.json"
local sys = require "cozy.sys"
local proc = require "cozy.proc"
local text = require "cozy.text"

local log = {}

local levels = { error = 0, warn = 0, info = 0, debug = 1 }

-- Progress lines are rate limited to one per this many seconds.
log.progress_interval = 5

local Logger = {}
Logger.__index = Logger

local function iso8601(t)
  local whole = math.floor(t)
  local ms = math.floor((t - whole) * 1000)
  return os.date("!%Y-%m-%dT%H:%M:%S", whole) .. (".%03dZ"):format(ms)
end
log.iso8601 = iso8601

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end

-- Text values: bare when they are simple words, quoted otherwise (a quote
-- and a backslash escaped), and every control character escaped
-- (text.line), so that a line stays one line and splits unambiguously on
-- spaces.
local function text_value(v)
  if type(v) == "table" then
    local ok, s = pcall(json.encode, v)
    v = ok and s or tostring(v)
  else
    v = tostring(v)
  end
  if v ~= "" and not v:find("[%s%c\"=]") then return v end
  return '"' .. text.line((v:gsub('[\\"]', "\\%0"))) .. '"'
end

-- A value as it may be printed (text.printable: strings made valid UTF-8
-- with credentials blanked, tables copied the same way to a bounded depth,
-- deeper levels shown as text). Every message and field goes through it,
-- whoever wrote it: a legacy script's Latin-1 line, an error body cut by a
-- server, curl quoting a proxy URL.
local function printable(v)
  return text.printable(v, 8)
end

local function merged(tags, fields)
  local all = {}
  for k, v in pairs(tags) do all[k] = v end
  if fields then
    for k, v in pairs(fields) do all[k] = v end
  end
  return printable(all)
end

function Logger:enabled(level)
  return (levels[level] or 0) <= self.verbosity
end

-- Writes s to the root's stream unless its output is gone: a failed write
-- (EPIPE once the reader of a pipe has gone, EBADF) ends the output for
-- good, never the run: SIGPIPE is ignored (core/signals.c), so a run
-- holding the lock goes on, stamps and releases it.
local function emit(root, s)
  if root.broken then return false end
  if not root.stream:write(s) then root.broken = true end
  return not root.broken
end

function Logger:write(level, message, fields)
  if not self:enabled(level) then return end
  local all = merged(self.tags, fields)
  -- JSON escapes every control character itself; a text line escapes them below
  message = text.safe(message)
  local line
  if self.format == "json" then
    local obj = { ts = iso8601(sys.time()), level = level, msg = message }
    for k, v in pairs(all) do
      if obj[k] == nil then obj[k] = v end
    end
    local ok, s = pcall(json.encode, obj)
    line = ok and s or json.encode({ ts = obj.ts, level = level, msg = message })
  else
    -- one line: no byte of the message or a field can start another
    local parts = { iso8601(sys.time()), ("%-5s"):format(level:upper()), text.line(message) }
    for _, k in ipairs(sorted_keys(all)) do
      parts[#parts + 1] = text.line(tostring(k)) .. "=" .. text_value(all[k])
    end
    line = table.concat(parts, " ")
  end
  local root = self.root
  -- One write call per line, newline included: on unbuffered stderr each
  -- call is one write(2), and another thread (the lease renewer) logs to
  -- the same file descriptor, so a line in two calls could be split.
  local out = line .. "\n"
  if root.bar_active then
    -- a progress bar occupies the current terminal line: clear it first
    out = "\r\27[K" .. out
    root.bar_active = false
  end
  if emit(root, out) then
    -- and draw it again below the line, so the bar stays the last line on
    -- the screen however many lines a run logs
    if root.bar then root.bar:draw(sys.monotime()) end
    root.stream:flush()
  end
  if root.sink then root.sink(level, message, all) end
end

function Logger:info(message, fields) self:write("info", message, fields) end
function Logger:warn(message, fields) self:write("warn", message, fields) end
function Logger:error(message, fields) self:write("error", message, fields) end
function Logger:debug(message, fields) self:write("debug", message, fields) end

-- A logger writing to the same stream with more tags.
function Logger:with(tags)
  local child = setmetatable({}, { __index = self })
  child.tags = merged(self.tags, tags)
  return child
end

local Progress = {}
Progress.__index = Progress

local function bar(done, total, width)
  if not total or total <= 0 then return "" end
  local filled = math.floor(width * math.min(done, total) / total)
  return "[" .. ("#"):rep(filled) .. ("."):rep(width - filled) .. "] "
end

local function seconds_text(t)
  if t >= 3600 then return ("%dh%02dm"):format(t // 3600, t % 3600 // 60) end
  if t >= 60 then return ("%dm%02ds"):format(t // 60, t % 60) end
  return ("%ds"):format(t)
end

-- Done per second so far, and the seconds left at that pace (nil when unknown).
function Progress:pace(now)
  local elapsed = now - self.started
  local rate = elapsed > 0 and self.done_count / elapsed or nil
  local eta = rate and rate > 0 and self.total and math.max(0, self.total - self.done_count) / rate
    or nil
  return rate, eta
end

-- The bar on the terminal's last line: "[####....] VMs 120/500 12.3/s ETA 31s".
function Progress:draw(now)
  local rate, eta = self:pace(now)
  local root = self.logger.root
  emit(root, table.concat { "\r\27[K", bar(self.done_count, self.total, 30),
    text.line(self.label), " ", tostring(self.done_count), self.total and ("/" .. self.total) or "",
    rate and (" %.1f/s"):format(rate) or "",
    eta and (" ETA " .. seconds_text(math.ceil(eta))) or "" })
  root.bar_active = true
  self.last_draw = now
end

-- Reports n_done (of total): on a terminal a bar redrawn in place (at most
-- five times a second, and after every log line); elsewhere a progress line
-- at most every log.progress_interval seconds, with rate and ETA.
function Progress:step(n_done)
  self.done_count = n_done or (self.done_count + 1)
  local now = sys.monotime()
  if self.logger.tty and self.logger.format == "text" then
    self.logger.root.bar = self
    if now - self.last_draw < 0.2 and self.done_count ~= self.total then return end
    self:draw(now)
    self.logger.root.stream:flush()
    return
  end
  if now - self.last_line < log.progress_interval then return end
  self.last_line = now
  local rate, eta = self:pace(now)
  self.logger:info("progress", { task = self.label, done = self.done_count, total = self.total,
    rate_per_s = rate and ("%.1f"):format(rate) or nil, eta_s = eta and math.ceil(eta) or nil })
end

function Progress:done()
  local root = self.logger.root
  if root.bar == self then root.bar = nil end
  self.logger:info("progress done", { task = self.label, done = self.done_count, total = self.total,
    seconds = ("%.1f"):format(sys.monotime() - self.started) })
end

function Logger:progress(label, total)
  local now = sys.monotime()
  return setmetatable({
    logger = self, label = tostring(label), total = total, done_count = 0,
    started = now, last_line = now, last_draw = -math.huge,
  }, Progress)
end

-- opts: format ("text"|"json"), verbosity (0 = info, 1 and up = debug; the
-- -v level, which a cozy.kube client reads for its request trace), stream
-- (default io.stderr), tty (draw bars; default: the stream is stderr and a
-- terminal), sink (function(level, message, fields), for tests and summaries).
function log.new(opts)
  opts = opts or {}
  local format = opts.format or "text"
  if format ~= "text" and format ~= "json" then
    error(("cozy.log: unknown format %q"):format(tostring(format)), 2)
  end
  local stream = opts.stream or io.stderr
  local tty = opts.tty
  if tty == nil then
    tty = stream == io.stderr and proc.isatty(2) and os.getenv("TERM") ~= "dumb"
  end
  local logger = setmetatable({
    format = format, verbosity = opts.verbosity or 0, stream = stream,
    tty = tty, tags = {}, sink = opts.sink, bar_active = false,
  }, Logger)
  logger.root = logger
  return logger
end

return log
