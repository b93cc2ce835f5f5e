-- paceline: every decision of a batch, checked and charged atomically on
-- the server. The same arithmetic as paceline-core's algorithms, on exact
-- integers: Lua numbers are doubles, so every value kept here stays below
-- 2^53 (instants are kept relative to "now", windows in whole seconds, and
-- the one product that can grow past it goes through `muldiv`).
--
-- KEYS: one per decision, all in one cluster slot.
-- ARGV: clock ("T" = the server's TIME, else "<secs> <nanos>"), ttl slack
-- (ms), lease ttl (ms), the number of plans P, P plan specs, the number
-- of distinct operations N, a string of one index (1 to N) per decision
-- (a byte each, or two, little end first, when N > 255), then the N
-- operations, four values each: op ("c" check, "r" release, "f<ns>"
-- refund of a charge made that many nanoseconds ago, "s<ns>" settle of
-- a check made that many nanoseconds ago), plan index, cost in requests,
-- cost in bytes (for a settle, what the answer cost more than the check
-- charged, negative when less).
-- After the operations, optionally, the groups: a string of one byte per
-- decision, 1 when the decision belongs to the group of the one before
-- it, else 0. A group (checks only) is all or nothing: its decisions are
-- checked in order, each seeing the charges of those before it; if any
-- refuses (outcome 1 or 2), every row it touched goes back to what it was
-- before the group and each of its checks that admitted answers its
-- standing as a cost-0 check would (outcome 0), so a refused group
-- charges nothing and shows no charge of its own.
-- Reply: one flat array of integers, decision after decision. A check
-- gives a head (its outcome: 0 allowed, 1 denied, 2 a cost over the
-- burst; plus 4 x the deciding policy's index; plus 64 x a bit per policy
-- that would deny, bit k - 1 for policy k), the wait (ns), then for each
-- policy of its plan the remaining and the reset (ns); a release, a
-- refund or a settle gives one 0. A duration of 2^53 ns or more (a window past
-- 104 days) comes as the string of its digits instead of an integer.
--
-- A plan spec is "algo,q,window_s,offset_s,shadow,unit;..." with algo one
-- of t (token bucket), f (fixed window), c (sliding counter), l (sliding
-- log), n (concurrency), shadow 0/1 and unit r (requests) or b (bytes).

-- Everything is built on the first call: while a function library loads,
-- Redis offers only the registration API (not even `math`).
local function make()
  local E9 = 1000000000
  local TWO53 = 9007199254740992
  local floor = math.floor
  local fmod = math.fmod
  local fmt = string.format
  local sbyte = string.byte

  -- floor(x / d) for exact integers below 2^53
  local function idiv(x, d)
    return (x - fmod(x, d)) / d
  end

  -- a * b as limbs of 2^22 (little end first), exact for a, b < 2^66
  local B = 4194304
  local function mul_limbs(a, b)
    local a0 = fmod(a, B); local a1 = fmod(idiv(a, B), B); local a2 = idiv(idiv(a, B), B)
    local b0 = fmod(b, B); local b1 = fmod(idiv(b, B), B); local b2 = idiv(idiv(b, B), B)
    local c = {a0 * b0, a0 * b1 + a1 * b0, a0 * b2 + a1 * b1 + a2 * b0, a1 * b2 + a2 * b1, a2 * b2, 0}
    for k = 1, 5 do
      local carry = idiv(c[k], B)
      c[k] = c[k] - carry * B
      c[k + 1] = c[k + 1] + carry
    end
    return c
  end

  -- limbs / d (d < 2^31) in place; returns the remainder
  local function div_limbs(c, d)
    local rem = 0
    for k = 6, 1, -1 do
      local cur = rem * B + c[k]
      rem = fmod(cur, d)
      c[k] = (cur - rem) / d
    end
    return rem
  end

  local function add_one(c)
    for k = 1, 6 do
      c[k] = c[k] + 1
      if c[k] < B then return end
      c[k] = 0
    end
  end

  -- the limbs' value, or TWO53 when it is that or more
  local function limbs_value(c)
    if c[6] > 0 or c[5] > 0 or c[4] > 0 or c[3] >= 512 then return TWO53 end
    return (c[3] * B + c[2]) * B + c[1]
  end

  -- floor (or ceil, when `up`) of a * b / (d1 * d2), exact, for a, b < 2^53
  -- and d1, d2 < 2^31; TWO53 when the result is at least that
  local function muldiv(a, b, d1, d2, up)
    local p = a * b
    local d = d1 * d2
    if p < TWO53 then
      local r = fmod(p, d)
      local q = (p - r) / d
      if up and r > 0 then q = q + 1 end
      return q
    end
    local c = mul_limbs(a, b)
    for _, dk in ipairs({d1, d2}) do
      if dk > 1 then
        local r = div_limbs(c, dk)
        if up and r > 0 then add_one(c) end
      end
    end
    return limbs_value(c)
  end

  -- A duration: a number of nanoseconds below 2^53, or (for windows longer
  -- than 104 days) a table {s, n} meaning s seconds less n nanoseconds.
  local function dur_parts(a)
    if type(a) ~= "number" then return a[1], a[2] end
    local r = fmod(a, E9)
    if r == 0 then return a / E9, 0 end
    return (a - r) / E9 + 1, E9 - r
  end

  local function dur_gt(a, b)
    if type(a) == "number" and type(b) == "number" then return a > b end
    local as, an = dur_parts(a)
    local bs, bn = dur_parts(b)
    if as ~= bs then return as > bs end
    return an < bn
  end

  local function dur_str(a)
    if type(a) == "number" then return fmt("%d", a) end
    local s, n = a[1], a[2]
    if n == 0 then return fmt("%d000000000", s) end
    return fmt("%d%09d", s - 1, E9 - n)
  end

  -- milliseconds, rounded up, no less than the duration
  local function dur_ms(a)
    if type(a) == "number" then return idiv(a + 999999, 1000000) end
    return a[1] * 1000
  end

  local plan_cache = {}
  local plan_cache_len = 0

  local function parse_plan(spec)
    local cached = plan_cache[spec]
    if cached then return cached end
    local plan = {}
    for a, q, ws, off, sh, u in string.gmatch(spec, "(%a),(%d+),(%d+),(%d+),(%d),(%a)") do
      local p = {a = a, q = tonumber(q), ws = tonumber(ws), off = tonumber(off), shadow = sh == "1", bytes = u == "b"}
      p.w = p.ws * E9
      if a == "t" then
        p.t = idiv(p.w, p.q)
        -- a burst of its own (in the offset field): a bucket of that many
        -- units refilling one each t; what follows reads q and w as the
        -- bucket's size and its span in time
        if p.off > 0 then p.q = p.off; p.w = p.off * p.t; p.off = 0 end
      end
      plan[#plan + 1] = p
    end
    -- token buckets and fixed windows (under 104 days: every duration a
    -- number) only: the row itself is the state
    -- (see "the flat path" below); p.at is where p's fields start in it
    local fast, at = true, 3
    for k = 1, #plan do
      local p = plan[k]
      if p.a == "t" then p.at = at; at = at + 1
      elseif p.a == "f" and p.ws < 9000000 then p.at = at; at = at + 2
      else fast = false end
    end
    plan.fast = fast
    if fast then
      -- the flat path reads each policy's constants from arrays (one
      -- table index each, no field look-up), and a row's fields as
      -- doubles after a marker byte (see flat_decode)
      local K, Q, T, W, WS, OFF, AT, BY, SH = {}, {}, {}, {}, {}, {}, {}, {}, {}
      for k = 1, #plan do
        local p = plan[k]
        K[k] = p.a == "t"; Q[k] = p.q; T[k] = p.t; W[k] = p.w; WS[k] = p.ws
        OFF[k] = p.off; AT[k] = p.at; BY[k] = p.bytes; SH[k] = p.shadow
      end
      plan.K, plan.Q, plan.T, plan.W, plan.WS, plan.OFF, plan.AT, plan.BY, plan.SH =
        K, Q, T, W, WS, OFF, AT, BY, SH
      plan.n = #plan
      plan.nf = at - 1
      -- rows of version 3 (marker 1: the fields), of version 4 (marker
      -- 2: the fields, then the instant the key expires at, see below)
      plan.fmt1 = "<" .. string.rep("d", at - 1)
      plan.fmt = "<" .. string.rep("d", at)
      plan.wfmt = "<B" .. string.rep("d", at)
      -- each window's index and time to its end, for the call's instant
      plan.WIDX, plan.WEND, plan.wnow_s, plan.wnow_n = {}, {}, -1, -1
    end
    if plan_cache_len >= 256 then plan_cache = {}; plan_cache_len = 0 end
    plan_cache[spec] = plan
    plan_cache_len = plan_cache_len + 1
    return plan
  end

  -- the clock of this call, and how long a lease lives (ns)
  local now_s, now_n, lease_ns

  -- ---- state rows: {written_s, written_n, per policy fields...} ----------
  -- token bucket: used (tat - now at writing, 0 when at rest)
  -- fixed window: index, count
  -- sliding counter: index, current, previous
  -- sliding log: n, then n stamps (each stamp - now at writing)
  -- concurrency: n, then n lease stamps (each stamp - now at writing); a
  -- lease older than the lease ttl was left by an instance that died

  local function fresh_state(p)
    if p.a == "t" then return {d = 0}
    elseif p.a == "f" then return {idx = -1, count = 0}
    elseif p.a == "c" then return {idx = 0, cur = 0, prev = 0}
    elseif p.a == "l" then return {log = {}}
    else return {leases = {}} end
  end

  local function decode(blob, plan)
    local n = #plan
    local states = {}
    local row = nil
    if blob then
      local ok, r = pcall(cmsgpack.unpack, blob)
      if ok and type(r) == "table" then row = r end
    end
    if not row then
      for k = 1, n do states[k] = fresh_state(plan[k]) end
      return states
    end
    -- written at (ws, wn): a relative x then is x + shift now
    local shift = (row[1] - now_s) * E9 + (row[2] - now_n)
    local i = 3
    for k = 1, n do
      local p = plan[k]
      local a = p.a
      if a == "t" then
        local d = row[i] + shift; i = i + 1
        if d < 0 then d = 0 end
        states[k] = {d = d}
      elseif a == "f" then
        states[k] = {idx = row[i], count = row[i + 1]}; i = i + 2
      elseif a == "c" then
        states[k] = {idx = row[i], cur = row[i + 1], prev = row[i + 2]}; i = i + 3
      elseif a == "l" then
        local m = row[i]; i = i + 1
        local log, len = {}, 0
        local w = p.w
        for j = i, i + m - 1 do
          local t = row[j] + shift
          if t > -w then len = len + 1; log[len] = t end
        end
        i = i + m
        states[k] = {log = log}
      else
        local m = row[i]; i = i + 1
        local leases, len = {}, 0
        for j = i, i + m - 1 do
          local t = row[j] + shift
          if t > -lease_ns then len = len + 1; leases[len] = t end
        end
        i = i + m
        states[k] = {leases = leases}
      end
    end
    return states
  end

  local function encode(states, plan)
    local row = {now_s, now_n}
    local i = 2
    for k = 1, #plan do
      local p, st = plan[k], states[k]
      local a = p.a
      if a == "t" then i = i + 1; row[i] = st.d
      elseif a == "f" then row[i + 1] = st.idx; row[i + 2] = st.count; i = i + 2
      elseif a == "c" then row[i + 1] = st.idx; row[i + 2] = st.cur; row[i + 3] = st.prev; i = i + 3
      else
        local list = st.log
        if a ~= "l" then list = st.leases end
        local m = #list
        i = i + 1; row[i] = m
        for j = 1, m do row[i + j] = list[j] end
        i = i + m
      end
    end
    return cmsgpack.pack(row)
  end

  -- ---- the algorithms: peek (would `cost` fit?) and commit ----------------

  local function window_index(p)
    return idiv(now_s + p.ws - p.off, p.ws)
  end

  local function roll(p, st)
    local idx = idiv(now_s, p.ws)
    if st.idx == idx then return idx, st.cur, st.prev end
    if st.idx + 1 == idx then return idx, 0, st.cur end
    return idx, 0, 0
  end

  local function counter_wait(prev, cur, q, cost, w, ws, left)
    if cur + cost <= q and prev > 0 then
      local room = q - cur - cost
      local max_left = muldiv(room, w, prev, 1, false)
      if max_left > left then max_left = left end
      return left - max_left
    end
    local room = q - cost
    if room < 0 then room = 0 end
    local c = cur
    if c < 1 then c = 1 end
    local max_left = muldiv(room, w, c, 1, false)
    if max_left > w then max_left = w end
    return left + (w - max_left)
  end

  -- when a sliding counter's row is empty again, once `c` is counted now
  local function counter_reset(c, prev, left, w)
    if c > 0 then return left + w elseif prev > 0 then return left else return 0 end
  end

  -- returns admit, remaining, reset, wait
  local function peek(p, st, cost)
    local a, q = p.a, p.q
    if a == "t" then
      local w, t = p.w, p.t
      local used_after = st.d + cost * t
      if used_after <= w then
        return true, idiv(w - used_after, t), used_after, 0
      end
      local room = w - st.d
      if room < 0 then room = 0 end
      return false, idiv(room, t), st.d, used_after - w
    elseif a == "f" then
      local idx = window_index(p)
      local count = 0
      if st.idx == idx then count = st.count end
      local d = idx * p.ws + p.off - now_s
      local until_end
      if d < 9000000 then until_end = d * E9 - now_n else until_end = {d, now_n} end
      if count + cost <= q then
        local after = count + cost
        if after == 0 then return true, q - after, 0, 0 end
        return true, q - after, until_end, 0
      end
      local rem = q - count
      if rem < 0 then rem = 0 end
      return false, rem, until_end, until_end
    elseif a == "c" then
      local w = p.w
      local idx, cur, prev = roll(p, st)
      local into = (now_s - idx * p.ws) * E9 + now_n
      local left = w - into
      local estimate = muldiv(prev, left, E9, p.ws, true) + cur
      if estimate + cost <= q then
        return true, q - estimate - cost, counter_reset(cur + cost, prev, left, w), 0
      end
      local wait = counter_wait(prev, cur, q, cost, w, p.ws, left)
      if wait < 1 then wait = 1 end
      local rem = q - estimate
      if rem < 0 then rem = 0 end
      return false, rem, counter_reset(cur, prev, left, w), wait
    elseif a == "l" then
      local w = p.w
      local log = st.log
      local count = #log
      if count + cost <= q then
        return true, q - count - cost, w, 0
      end
      local sorted = {}
      for j = 1, count do sorted[j] = log[j] end
      table.sort(sorted)
      local k = count + cost - q
      local wait = sorted[k] + w
      if wait < 1 then wait = 1 end
      local reset = 0
      if count > 0 then reset = sorted[count] + w end
      return false, q - count, reset, wait
    else
      local n = #st.leases
      if n + cost <= q then return true, q - n - cost, 0, 0 end
      local rem = q - n
      if rem < 0 then rem = 0 end
      return false, rem, 0, E9
    end
  end

  local function commit(p, st, cost)
    local a = p.a
    if a == "t" then
      st.d = st.d + cost * p.t
    elseif a == "f" then
      local idx = window_index(p)
      if st.idx ~= idx then st.idx = idx; st.count = 0 end
      st.count = st.count + cost
    elseif a == "c" then
      st.idx, st.cur, st.prev = roll(p, st)
      st.cur = st.cur + cost
    elseif a == "l" then
      local log = st.log
      for _ = 1, cost do log[#log + 1] = 0 end
    else
      local leases = st.leases
      for _ = 1, cost do leases[#leases + 1] = 0 end
    end
  end

  -- how long the row must be kept (ms, rounded up)
  local function keep_ms(plan, states)
    local keep = 0
    for k = 1, #plan do
      local p, st = plan[k], states[k]
      local ms = 0
      if p.a == "t" then ms = dur_ms(st.d)
      elseif p.a == "n" then
        local newest = nil
        for _, t in ipairs(st.leases) do
          if newest == nil or t > newest then newest = t end
        end
        if newest ~= nil then ms = dur_ms(newest + lease_ns) end
      elseif p.a == "l" then if #st.log > 0 then ms = p.ws * 1000 end
      elseif p.a == "f" then
        if st.count > 0 then ms = (st.idx * p.ws + p.off - now_s + 1) * 1000 end
      else
        if st.cur > 0 or st.prev > 0 then ms = p.ws * 2000 + 1000 end
      end
      if ms > keep then keep = ms end
    end
    return keep
  end

  -- ---- one decision --------------------------------------------------------

  -- a duration: an integer, or past 2^53 ns the string of its digits
  local function dur_out(a)
    if type(a) == "number" then return a end
    return dur_str(a)
  end

  -- the head's outcome and policy, added to the flags already in it (the
  -- caller sets the head to 0 first: the reply table is reused)
  local function put_head(out, o, code, policy, w)
    out[o + 1] = out[o + 1] + code + 4 * policy
    out[o + 2] = dur_out(w)
  end

  -- policy k's status; its flag goes into the head, which is written first
  local function put_status(out, o, k, r, t, d)
    out[o + 2 * k + 1] = r
    out[o + 2 * k + 2] = dur_out(t)
    if d then out[o + 1] = out[o + 1] + 64 * 2 ^ (k - 1) end
  end

  -- a cost over policy i's burst: nothing is charged, and every policy's
  -- standing is told
  local function cost_exceeds(plan, states, i, out, o)
    put_head(out, o, 2, i - 1, 0)
    for k = 1, #plan do
      local adm, r, t = peek(plan[k], states[k], 0)
      put_status(out, o, k, r, t, not adm)
    end
    return o + 2 + 2 * #plan
  end

  local admitted = {}

  -- checks one decision, its reply written from out[o + 1] on; returns
  -- where the reply ends and whether state changed
  local function check(plan, states, cr, cb, out, o)
    local n = #plan
    if n == 1 then
      local p, st = plan[1], states[1]
      local c = cr
      if p.bytes then c = cb end
      if c > p.q then
        if not p.shadow then return cost_exceeds(plan, states, 1, out, o), false end
        local _, r, t = peek(p, st, 0)
        put_head(out, o, 0, 0, 0)
        put_status(out, o, 1, r, t, true)
        return o + 4, false
      end
      local adm, r, t, w = peek(p, st, c)
      if adm then
        commit(p, st, c)
        put_head(out, o, 0, 0, 0)
      elseif p.shadow then
        put_head(out, o, 0, 0, 0)
      else
        put_head(out, o, 1, 0, w)
      end
      put_status(out, o, 1, r, t, not adm)
      return o + 4, adm and c > 0
    end
    for k = 1, n do
      local p = plan[k]
      local c = cr
      if p.bytes then c = cb end
      if c > p.q and not p.shadow then return cost_exceeds(plan, states, k, out, o), false end
    end
    local denial, dwait
    -- the head's place first: the reply table fills in order, so it grows
    -- as an array (filled out of order, Lua rehashes it again and again)
    out[o + 1] = 0; out[o + 2] = 0
    for k = 1, n do
      local p = plan[k]
      local c = cr
      if p.bytes then c = cb end
      local adm, r, t, w
      if c > p.q then
        local _, r0 = peek(p, states[k], 0)
        adm, r, t, w = false, r0, 0, nil
      else
        adm, r, t, w = peek(p, states[k], c)
      end
      admitted[k] = adm
      if not adm and not p.shadow and (denial == nil or dur_gt(w, dwait)) then
        denial, dwait = k, w
      end
      put_status(out, o, k, r, t, not adm)
    end
    local changed = false
    if denial then
      -- nothing is charged: the admitted ones' standing as it stays
      for k = 1, n do
        if admitted[k] then
          local _, r, t = peek(plan[k], states[k], 0)
          out[o + 2 * k + 1] = r
          out[o + 2 * k + 2] = dur_out(t)
        end
      end
      put_head(out, o, 1, denial - 1, dwait)
    else
      for k = 1, n do
        if admitted[k] then
          local p = plan[k]
          local c = cr
          if p.bytes then c = cb end
          commit(p, states[k], c)
          if c > 0 then changed = true end
        end
      end
      put_head(out, o, 0, 0, 0)
    end
    return o + 2 + 2 * n, changed
  end

  local function release(plan, states, amount)
    local changed = false
    for k, p in ipairs(plan) do
      if p.a == "n" then
        local st = states[k]
        local leases = st.leases
        if #leases > 0 and amount > 0 then
          -- which lease ends is not known: the newest goes first, so one
          -- left behind keeps its own stamp and expires on time
          table.sort(leases)
          local kept = {}
          for j = 1, #leases - amount do kept[#kept + 1] = leases[j] end
          st.leases = kept
          changed = true
        end
      end
    end
    return changed
  end

  -- gives back a charge made `age` ns ago whose answer never came: what
  -- each policy can give without inventing room it never had (the same
  -- rules as paceline-core's refund)
  local function refund(plan, states, cr, cb, age, tolerance)
    local changed = false
    local age_s = idiv(age, E9)
    local charged_s = now_s - age_s
    if fmod(age, E9) > now_n then charged_s = charged_s - 1 end
    for k, p in ipairs(plan) do
      local st = states[k]
      local c = cr
      if p.bytes then c = cb end
      if p.shadow or c <= 0 then
        -- a shadow policy charges nothing to give back
      elseif p.a == "t" then
        local d = st.d - c * p.t
        if d < 0 then d = 0 end
        if d ~= st.d then st.d = d; changed = true end
      elseif p.a == "f" then
        local idx = idiv(charged_s + p.ws - p.off, p.ws)
        if st.idx == idx and idx == window_index(p) and st.count > 0 then
          st.count = st.count - c
          if st.count < 0 then st.count = 0 end
          changed = true
        end
      elseif p.a == "c" then
        st.idx, st.cur, st.prev = roll(p, st)
        local at = idiv(charged_s, p.ws)
        if at == st.idx and st.cur > 0 then
          st.cur = st.cur - c; if st.cur < 0 then st.cur = 0 end; changed = true
        elseif at + 1 == st.idx and st.prev > 0 then
          st.prev = st.prev - c; if st.prev < 0 then st.prev = 0 end; changed = true
        end
      elseif p.a == "l" then
        -- the entries of the charge's instant: on the caller's clock
        -- exactly; on the server's, the nearest within `tolerance` (the
        -- two clocks tick apart by the round trip)
        local log = st.log
        for _ = 1, c do
          local best, dist = nil, nil
          for j, t in ipairs(log) do
            local d = t + age
            if d < 0 then d = -d end
            if d <= tolerance and (best == nil or d < dist) then best, dist = j, d end
          end
          if best == nil then break end
          table.remove(log, best)
          changed = true
        end
      end
      -- concurrency: the request's lease gives its units back
    end
    return changed
  end

  -- the most a fixed window counts (paceline-core keeps 40 bits)
  local COUNT_MAX = 1099511627775

  -- settles a check made `age` ns ago whose answer cost `dr` requests and
  -- `db` bytes more (or, negative, less) than it charged: less is given
  -- back as refund gives back; more is charged whatever the room, the
  -- work being done, into a debt with paceline-core's bounds (a bucket
  -- owes at most one full burst, a window counts up to COUNT_MAX, a
  -- sliding counter or log fills at most to q). Shadow policies and
  -- concurrency caps are left alone.
  local function settle(plan, states, dr, db, age, tolerance)
    local changed = false
    for k, p in ipairs(plan) do
      local st = states[k]
      local c = dr
      if p.bytes then c = db end
      if p.shadow or c == 0 or p.a == "n" then
        -- nothing to settle
      elseif c < 0 then
        if refund({p}, {st}, -c, -c, age, tolerance) then changed = true end
      elseif p.a == "t" then
        local d = st.d + c * p.t
        if d > 2 * p.w then d = 2 * p.w end
        if d > st.d then st.d = d; changed = true end
      elseif p.a == "f" then
        local idx = window_index(p)
        if st.idx ~= idx then st.idx = idx; st.count = 0 end
        local n = st.count + c
        if n > COUNT_MAX then n = COUNT_MAX end
        st.count = n
        changed = true
      elseif p.a == "c" then
        st.idx, st.cur, st.prev = roll(p, st)
        local n = st.cur + c
        if n > p.q then n = p.q end
        if n > st.cur then st.cur = n end
        changed = true
      elseif p.a == "l" then
        local n = c
        if n > p.q then n = p.q end
        local log = st.log
        for _ = 1, n do log[#log + 1] = 0 end
        if #log > p.q then
          -- the log holds q entries: the oldest go
          table.sort(log)
          local kept = {}
          for j = #log - p.q + 1, #log do kept[#kept + 1] = log[j] end
          st.log = kept
        end
        changed = true
      end
    end
    return changed
  end

  -- ---- the flat path ------------------------------------------------------
  -- A plan of token buckets and fixed windows only (the common case) keeps
  -- its row as decoded: {written_s, written_n, fields...}, a bucket's `used`
  -- at p.at, a window's index and count at p.at and p.at + 1. The same
  -- arithmetic as peek and commit above, without a table per policy;
  -- floor(x / d) is exact for integers 0 <= x < 2^53.

  -- A flat row as stored: the byte 2, then its fields and the instant
  -- (ms, the server's clock) its key expires at, as little-endian doubles
  -- (exact: every value stays below 2^53); in the row as decoded that
  -- instant is at nf + 1 (0: not known). Rows of version 3 (the byte 1,
  -- the fields alone) and of version 2 (msgpack arrays, whose first byte
  -- is 0x90 and up) are still read.
  local function flat_decode(blob, plan)
    local nf = plan.nf
    local row = nil
    if blob then
      local marker = string.byte(blob, 1)
      if #blob == 9 + 8 * nf and marker == 2 then
        row = {struct.unpack(plan.fmt, blob, 2)}
        row[nf + 2] = nil
      elseif #blob == 1 + 8 * nf and marker == 1 then
        row = {struct.unpack(plan.fmt1, blob, 2)}
        row[nf + 1] = 0
      else
        local ok, r = pcall(cmsgpack.unpack, blob)
        if ok and type(r) == "table" and #r == nf then row = r; row[nf + 1] = 0 end
      end
    end
    if not row then
      row = {0, 0}
      for k = 1, #plan do
        local p = plan[k]
        if p.a == "t" then row[p.at] = 0 else row[p.at] = -1; row[p.at + 1] = 0 end
      end
      row[nf + 1] = 0
      return row
    end
    local shift = (row[1] - now_s) * E9 + (row[2] - now_n)
    local K, AT = plan.K, plan.AT
    for k = 1, plan.n do
      if K[k] then
        local at = AT[k]
        local d = row[at] + shift
        if d < 0 then d = 0 end
        row[at] = d
      end
    end
    return row
  end

  local function flat_encode(plan, row)
    return struct.pack(plan.wfmt, 2, unpack(row, 1, plan.nf + 1))
  end

  -- the windows' indices and times to their ends at the call's instant,
  -- worked out once per plan and call
  local function flat_windows(plan)
    if plan.wnow_s == now_s and plan.wnow_n == now_n then return end
    local K, WS, OFF, WIDX, WEND = plan.K, plan.WS, plan.OFF, plan.WIDX, plan.WEND
    for k = 1, plan.n do
      if not K[k] then
        local ws, off = WS[k], OFF[k]
        local x = now_s + ws - off
        local idx = (x - x % ws) / ws
        WIDX[k] = idx
        WEND[k] = (idx * ws + off - now_s) * E9 - now_n
      end
    end
    plan.wnow_s, plan.wnow_n = now_s, now_n
  end

  -- a flat policy's standing as it is (a cost-0 peek): remaining, reset,
  -- and 1 if even that would deny (a state past its quota), else 0
  local function flat_stand(plan, row, k)
    local at, q = plan.AT[k], plan.Q[k]
    if plan.K[k] then
      local t, d, w = plan.T[k], row[at], plan.W[k]
      if d > w then return 0, d, 1 end
      local x = w - d
      return (x - x % t) / t, d, 0
    end
    local count = row[at + 1]
    if row[at] ~= plan.WIDX[k] or count == 0 then return q, 0, 0 end
    if count > q then return 0, plan.WEND[k], 1 end
    return q - count, plan.WEND[k], 0
  end

  local NEW = {}

  -- check, on a flat row: the same outcome, fields and charges as check
  -- (every duration a number), each policy peeked and its charge worked
  -- out in one pass; x - x % d is d * floor(x / d), exactly, for
  -- integers 0 <= x < 2^53
  local function flat_check(plan, row, cr, cb, out, o)
    flat_windows(plan)
    local n = plan.n
    local K, Q, T, W, AT, BY, SH = plan.K, plan.Q, plan.T, plan.W, plan.AT, plan.BY, plan.SH
    local WIDX, WEND = plan.WIDX, plan.WEND
    -- the head's place first: the reply fills in order, as an array
    out[o + 1] = 0; out[o + 2] = 0
    local denial, dwait
    local s = o + 2
    local admitted_mask = 0
    local bit = 1
    for k = 1, n do
      local c = cr
      if BY[k] then c = cb end
      local q, at = Q[k], AT[k]
      local adm, r, t, w
      if c > q then
        if not SH[k] then
          -- a cost over a burst: nothing is charged, every standing told
          local head = 2 + 4 * (k - 1)
          local b = 64
          s = o + 2
          for j = 1, n do
            local r0, t0, d0 = flat_stand(plan, row, j)
            out[s + 1] = r0; out[s + 2] = t0
            head = head + d0 * b
            b = b + b
            s = s + 2
          end
          out[o + 1] = head; out[o + 2] = 0
          return s, false
        end
        -- a shadow policy the cost is over: it would deny
        local r0, t0 = flat_stand(plan, row, k)
        adm, r = false, r0
        if n == 1 then t = t0 else t = 0 end
      elseif K[k] then
        local tk, wk, d = T[k], W[k], row[at]
        local after = d + c * tk
        if after <= wk then
          local x = wk - after
          adm, r, t = true, (x - x % tk) / tk, after
          NEW[k] = after
        else
          local x = wk - d
          if x < 0 then x = 0 end
          adm, r, t, w = false, (x - x % tk) / tk, d, after - wk
        end
      else
        local count = 0
        if row[at] == WIDX[k] then count = row[at + 1] end
        local after = count + c
        if after <= q then
          adm, r = true, q - after
          if after == 0 then t = 0 else t = WEND[k] end
          NEW[k] = after
        else
          local rem = q - count
          if rem < 0 then rem = 0 end
          adm, r, t, w = false, rem, WEND[k], WEND[k]
        end
      end
      if adm then
        admitted_mask = admitted_mask + bit
      elseif not SH[k] and (denial == nil or w > dwait) then
        denial, dwait = k, w
      end
      out[s + 1] = r; out[s + 2] = t
      s = s + 2
      bit = bit + bit
    end
    if denial then
      if n > 1 then
        -- nothing is charged: the admitted ones' standing as it stays
        local m = admitted_mask
        for k = 1, n do
          if m % 2 == 1 then
            local r, t = flat_stand(plan, row, k)
            out[o + 2 * k + 1] = r
            out[o + 2 * k + 2] = t
          end
          m = (m - m % 2) / 2
        end
      end
      -- bit - 1 has a bit per policy: those not admitted would deny
      out[o + 1] = 1 + 4 * (denial - 1) + 64 * (bit - 1 - admitted_mask)
      out[o + 2] = dwait
      return s, false
    end
    out[o + 1] = 64 * (bit - 1 - admitted_mask)
    -- no denial: each admitted policy is charged (a shadow one that would
    -- deny is not)
    local changed = false
    local m = admitted_mask
    for k = 1, n do
      if m % 2 == 1 then
        local c = cr
        if BY[k] then c = cb end
        if c > 0 then
          local at = AT[k]
          if K[k] then
            row[at] = NEW[k]
          else
            row[at] = WIDX[k]; row[at + 1] = NEW[k]
          end
          changed = true
        end
      end
      m = (m - m % 2) / 2
    end
    return s, changed
  end

  local function flat_keep_ms(plan, row)
    local keep = 0
    local K, AT, WS, OFF = plan.K, plan.AT, plan.WS, plan.OFF
    for k = 1, plan.n do
      local at = AT[k]
      local ms = 0
      if K[k] then
        local x = row[at] + 999999
        ms = (x - x % 1000000) / 1000000
      elseif row[at + 1] > 0 then
        ms = (row[at] * WS[k] + OFF[k] - now_s + 1) * 1000
      end
      if ms > keep then keep = ms end
    end
    return keep
  end

  -- the per-policy states of a flat row, and back (for the rare release
  -- and refund, which then run as for any plan)
  local function flat_states(plan, row)
    local states = {}
    for k = 1, #plan do
      local p = plan[k]
      if p.a == "t" then states[k] = {d = row[p.at]}
      else states[k] = {idx = row[p.at], count = row[p.at + 1]} end
    end
    return states
  end

  local function flat_store(plan, row, states)
    for k = 1, #plan do
      local p, st = plan[k], states[k]
      if p.a == "t" then row[p.at] = st.d
      else row[p.at] = st.idx; row[p.at + 1] = st.count end
    end
  end

  -- ---- the flat path, compiled ------------------------------------------
  -- A flat plan's check, row decoding, keep time and encoding, written out
  -- as Lua source for that plan alone (each policy's constants inlined, no
  -- loop over policies, no table per policy) and compiled once, when the
  -- plan is first seen. The same outcome, fields and charges as
  -- flat_check, which stays the path where `loadstring` is missing or
  -- the source fails to compile. The source holds nothing but numbers of
  -- the parsed spec (each through "%d") and fixed text.

  local function gen_flat(plan)
    if type(loadstring) ~= "function" then return nil end
    local n, nf = plan.n, plan.nf
    local K, Q, T, W, WS, OFF, AT, BY, SH =
      plan.K, plan.Q, plan.T, plan.W, plan.WS, plan.OFF, plan.AT, plan.BY, plan.SH
    local src = {}
    local function emit(...) src[#src + 1] = fmt(...) end
    emit("local E9, spack, sunpack, byte, fallback = ...\n")
    emit("local now_s, now_n = -1, -1\n")
    for k = 1, n do
      if not K[k] then emit("local widx%d, wend%d = 0, 0\n", k, k) end
    end
    emit("local P = {}\n")
    -- the windows' indices and times to their ends, once per call
    emit("function P.prepare(s, ns)\n now_s, now_n = s, ns\n")
    for k = 1, n do
      if not K[k] then
        emit(" do local x = s + %d - %d; widx%d = (x - x %% %d) / %d\n", WS[k], OFF[k], k, WS[k], WS[k])
        emit(" wend%d = (widx%d * %d + %d - s) * E9 - ns end\n", k, k, WS[k], OFF[k])
      end
    end
    emit("end\n")
    -- each policy's standing as it is: remaining, reset, 1 if past quota
    for k = 1, n do
      local at = AT[k]
      emit("local function stand%d(row)\n", k)
      if K[k] then
        emit(" local d = row[%d]\n if d > %d then return 0, d, 1 end\n", at, W[k])
        emit(" local x = %d - d\n return (x - x %% %d) / %d, d, 0\nend\n", W[k], T[k], T[k])
      else
        emit(" local count = row[%d]\n", at + 1)
        emit(" if row[%d] ~= widx%d or count == 0 then return %d, 0, 0 end\n", at, k, Q[k])
        emit(" if count > %d then return 0, wend%d, 1 end\n", Q[k], k)
        emit(" return %d - count, wend%d, 0\nend\n", Q[k], k)
      end
    end
    -- decoding: a row of this version, else the generic reader
    local len = 9 + 8 * nf
    emit("function P.decode(blob)\n if blob and #blob == %d and byte(blob, 1) == 2 then\n", len)
    local fields = {}
    for i = 1, nf + 1 do fields[i] = "f" .. i end
    local list = table.concat(fields, ", ")
    emit("  local _, %s = sunpack(\"<B%s\", blob)\n", list, string.rep("d", nf + 1))
    emit("  local shift = (f1 - now_s) * E9 + (f2 - now_n)\n")
    for k = 1, n do
      if K[k] then emit("  f%d = f%d + shift; if f%d < 0 then f%d = 0 end\n", AT[k], AT[k], AT[k], AT[k]) end
    end
    emit("  return {%s}\n end\n return fallback(blob)\nend\n", list)
    -- the time the row must be kept (ms)
    emit("function P.keep(row)\n local keep, x, ms = 0\n")
    for k = 1, n do
      local at = AT[k]
      if K[k] then
        emit(" x = row[%d] + 999999; ms = (x - x %% 1000000) / 1000000; if ms > keep then keep = ms end\n", at)
      else
        emit(" if row[%d] > 0 then ms = (row[%d] * %d + %d - now_s + 1) * 1000; if ms > keep then keep = ms end end\n",
          at + 1, at, WS[k], OFF[k])
      end
    end
    emit(" return keep\nend\n")
    local rows = {}
    for i = 1, nf + 1 do rows[i] = fmt("row[%d]", i) end
    emit("function P.encode(row)\n return spack(\"<B%s\", 2, %s)\nend\n", string.rep("d", nf + 1), table.concat(rows, ", "))
    -- the check: flat_check, unrolled
    emit("function P.check(row, cr, cb, out, o)\n out[o + 1] = 0; out[o + 2] = 0\n")
    local last = fmt("o + %d", 2 + 2 * n)
    for k = 1, n do
      local c = BY[k] and "cb" or "cr"
      local at, q = AT[k], Q[k]
      emit(" local a%d, r%d, t%d, w%d, n%d\n", k, k, k, k, k)
      emit(" if %s > %d then\n", c, q)
      if not SH[k] then
        -- a cost over a burst: nothing is charged, every standing told
        emit("  local head, r, t, d = %d\n", 2 + 4 * (k - 1))
        for j = 1, n do
          emit("  r, t, d = stand%d(row); out[o + %d] = r; out[o + %d] = t; head = head + d * %d\n",
            j, 2 * j + 1, 2 * j + 2, 64 * 2 ^ (j - 1))
        end
        emit("  out[o + 1] = head; out[o + 2] = 0\n  return %s, false\n", last)
      else
        emit("  a%d = false; r%d, t%d = stand%d(row)\n", k, k, k, k)
        if n ~= 1 then emit("  t%d = 0\n", k) end
      end
      if K[k] then
        local tk, wk = T[k], W[k]
        emit(" else\n  local d = row[%d]; local after = d + %s * %d\n", at, c, tk)
        emit("  if after <= %d then local x = %d - after; a%d = true; r%d = (x - x %% %d) / %d; t%d = after; n%d = after\n",
          wk, wk, k, k, tk, tk, k, k)
        emit("  else local x = %d - d; if x < 0 then x = 0 end; a%d = false; r%d = (x - x %% %d) / %d; t%d = d; w%d = after - %d end\n",
          wk, k, k, tk, tk, k, k, wk)
      else
        emit(" else\n  local count = 0; if row[%d] == widx%d then count = row[%d] end\n", at, k, at + 1)
        emit("  local after = count + %s\n", c)
        emit("  if after <= %d then a%d = true; r%d = %d - after; if after == 0 then t%d = 0 else t%d = wend%d end; n%d = after\n",
          q, k, k, q, k, k, k, k)
        emit("  else local rem = %d - count; if rem < 0 then rem = 0 end; a%d = false; r%d = rem; t%d = wend%d; w%d = wend%d end\n",
          q, k, k, k, k, k, k)
      end
      emit(" end\n out[o + %d] = r%d; out[o + %d] = t%d\n", 2 * k + 1, k, 2 * k + 2, k)
    end
    -- the deciding policy: the first of the longest waits
    emit(" local denial, dwait, bits = 0, 0, 0\n")
    for k = 1, n do
      emit(" if not a%d then bits = bits + %d", k, 2 ^ (k - 1))
      if not SH[k] then emit("; if denial == 0 or w%d > dwait then denial = %d; dwait = w%d end", k, k, k) end
      emit(" end\n")
    end
    emit(" if denial > 0 then\n")
    if n > 1 then
      for k = 1, n do
        emit("  if a%d then out[o + %d], out[o + %d] = stand%d(row) end\n", k, 2 * k + 1, 2 * k + 2, k)
      end
    end
    emit("  out[o + 1] = 1 + 4 * (denial - 1) + 64 * bits; out[o + 2] = dwait\n  return %s, false\n end\n", last)
    emit(" out[o + 1] = 64 * bits\n local changed = false\n")
    for k = 1, n do
      local c = BY[k] and "cb" or "cr"
      emit(" if a%d and %s > 0 then ", k, c)
      if K[k] then emit("row[%d] = n%d", AT[k], k) else emit("row[%d] = widx%d; row[%d] = n%d", AT[k], k, AT[k] + 1, k) end
      emit("; changed = true end\n")
    end
    emit(" return %s, changed\nend\nreturn P\n", last)
    local chunk = loadstring(table.concat(src))
    if not chunk then return nil end
    local ok, gen = pcall(chunk, E9, struct.pack, struct.unpack, string.byte,
      function(blob) return flat_decode(blob, plan) end)
    if not ok then return nil end
    return gen
  end

  -- "PX" values as strings, memoised: a number's conversion is costly and
  -- rows of one plan mostly share a value (rounded up to whole seconds)
  local px_memo, px_memo_len = {}, 0
  local function px(ms)
    local x = ms + 999
    ms = x - x % 1000
    local s = px_memo[ms]
    if s then return s end
    s = fmt("%d", ms)
    if px_memo_len >= 1024 then px_memo = {}; px_memo_len = 0 end
    px_memo[ms] = s
    px_memo_len = px_memo_len + 1
    return s
  end

  -- whole numbers as sent, read once: tonumber goes through the C
  -- library's strtod, about 2,000 instructions each, and a call's numbers
  -- mostly repeat (its costs, the slack, the lease time); small ones
  -- always, others as met, at most 1,024 of them
  local SMALL = {}
  for v = 0, 255 do SMALL[tostring(v)] = v end
  local num_memo, num_memo_len = {}, 0
  local function num(s)
    local v = SMALL[s]
    if v then return v end
    v = num_memo[s]
    if v then return v end
    v = tonumber(s)
    if v and #s <= 20 then
      if num_memo_len >= 1024 then num_memo = {}; num_memo_len = 0 end
      num_memo[s] = v
      num_memo_len = num_memo_len + 1
    end
    return v
  end

  -- the server's clock into now_s and now_n: its seconds read once a
  -- second, its microseconds (at most six digits, none leading zero) by
  -- their bytes rather than through strtod
  local time_s_str, time_s = nil, 0
  local function server_now()
    local t = redis.call("TIME")
    local s, us = t[1], t[2]
    if s ~= time_s_str then time_s = tonumber(s); time_s_str = s end
    now_s = time_s
    local n = #us
    if n < 1 or n > 6 then now_n = tonumber(us) * 1000; return end
    local a, b, c, d, e, f = sbyte(us, 1, n)
    local v = a - 48
    if b then v = v * 10 + b - 48 end
    if c then v = v * 10 + c - 48 end
    if d then v = v * 10 + d - 48 end
    if e then v = v * 10 + e - 48 end
    if f then v = v * 10 + f - 48 end
    now_n = v * 1000
  end

  -- the call's clock into now_s and now_n: "T" the server's, else the
  -- caller's "<secs> <nanos>"; false when it is neither
  local function set_clock(c)
    if c == "T" then server_now(); return true end
    local s, n = string.match(c or "", "^(%d+) (%d+)$")
    if not s then return false end
    now_s = tonumber(s); now_n = tonumber(n)
    return true
  end

  -- ---- groups --------------------------------------------------------------

  -- one check on a decoded row, whichever path its plan takes; its reply
  -- written from out[o + 1] on: returns where it ends and whether the row
  -- changed
  local function run_check(plan, states, cr, cb, out, o)
    local gen = plan.gen
    if gen then return gen.check(states, cr, cb, out, o) end
    if plan.fast then return flat_check(plan, states, cr, cb, out, o) end
    out[o + 1] = 0
    return check(plan, states, cr, cb, out, o)
  end

  -- a decoded row, copied (a group's refusal puts it back)
  local function copy_states(plan, states)
    if plan.fast then return {unpack(states, 1, plan.nf + 1)} end
    local c = {}
    for k = 1, #plan do
      local t = {}
      for f, v in pairs(states[k]) do
        if type(v) == "table" then
          local a = {}
          for j = 1, #v do a[j] = v[j] end
          v = a
        end
        t[f] = v
      end
      c[k] = t
    end
    return c
  end

  local ONE = {1}
  -- a call's bookkeeping, kept from call to call: a table grown afresh in
  -- every call is rehashed at every power of two (Lua 5.1 counts its keys
  -- each time), one kept only has its used slots cleared
  local S_order, S_row_of, S_plan, S_states, S_dirty, S_out = {}, {}, {}, {}, {}, {}
  local s_rows = 0
  -- the call's distinct operations (op, plan, cost in requests, in bytes)
  local O_op, O_plan, O_cr, O_cb = {}, {}, {}, {}
  local byte = string.byte
  -- SET ... KEEPTTL (Redis 6.0 on; asked of 7.0 on, which says its version)
  local keepttl = redis.REDIS_VERSION_NUM ~= nil
  -- how much longer than it must a key is kept when its expiry is set,
  -- so that the writes that follow keep it (KEEPTTL) instead of setting
  -- it again: as long again as it must, at most a minute (ms)
  local MARGIN_MAX = 60000

  -- writes a flat row that a call changed (`now_ms`: the instant in ms on
  -- the server's clock, nil on the caller's)
  local function write_flat(key, plan, states, slack, now_ms)
    local gen = plan.gen
    local keep
    if gen then keep = gen.keep(states) else keep = flat_keep_ms(plan, states) end
    if keep <= 0 then
      redis.call("DEL", key)
      return
    end
    -- kept for whole seconds, past the slack; a key that already lives
    -- that long keeps its expiry (a write that sets none costs the server
    -- less)
    local x = keep + slack + 999
    local ms = x - x % 1000
    local e = plan.nf + 1
    local keep_ttl = now_ms and states[e] >= now_ms + ms
    if not keep_ttl then
      local m = ms
      if m > MARGIN_MAX then m = MARGIN_MAX end
      ms = ms + m
      if now_ms then states[e] = now_ms + ms else states[e] = 0 end
    end
    states[1] = now_s; states[2] = now_n
    local blob
    if gen then blob = gen.encode(states) else blob = flat_encode(plan, states) end
    if keep_ttl then
      redis.call("SET", key, blob, "KEEPTTL")
    else
      redis.call("SET", key, blob, "PX", px(ms))
    end
  end

  local generic

  -- A lone check (`one`): KEYS one row; ARGV the clock (as for a batch),
  -- a head "<ttl slack ms> <lease ttl ms> <plan spec>", the cost in
  -- requests and in bytes. The reply is the check's, as in a batch. Only
  -- the step a lone decision needs: its head read once per distinct head,
  -- no batch's bookkeeping; a plan without a compiled flat path goes the
  -- batch's way. (Answering the values as one string instead of an array
  -- costs more: string.format's %d is the C library's sprintf.)
  local heads, heads_len = {}, 0
  local ONE_OUT = {}
  local function one(keys, args)
    if not redis.REDIS_VERSION_NUM and redis.replicate_commands then
      pcall(redis.replicate_commands)
    end
    local hs = args[2]
    if #keys ~= 1 or not args[4] then
      return redis.error_reply("paceline: a lone check needs one key, a clock, a head and two costs")
    end
    local h = heads[hs]
    if not h then
      local sl, le, spec = string.match(hs, "^(%d+) (%d+) (.+)$")
      if not spec then return redis.error_reply("paceline: unreadable head " .. hs) end
      h = {num(sl), num(le) * 1000000, parse_plan(spec), sl, le, spec}
      local plan = h[3]
      if plan.fast and plan.gen == nil then
        plan.gen = false
        if plan.n <= 12 then plan.gen = gen_flat(plan) or false end
      end
      if heads_len >= 256 then heads = {}; heads_len = 0 end
      heads[hs] = h
      heads_len = heads_len + 1
    end
    local cr, cb = num(args[3]), num(args[4])
    if not cr or not cb or cr < 0 or cb < 0 or cr ~= floor(cr) or cb ~= floor(cb) then
      return redis.error_reply("paceline: a cost is not a whole number of units")
    end
    local plan = h[3]
    local gen = plan.gen
    if not gen then
      return generic(keys, {args[1], h[4], h[5], "1", h[6], "1", "\1", "c", "0", args[3], args[4]})
    end
    local server = args[1] == "T"
    if not set_clock(args[1]) then return redis.error_reply("paceline: unreadable clock") end
    lease_ns = h[2]
    gen.prepare(now_s, now_n)
    local key = keys[1]
    local blob = redis.call("GET", key)
    if not blob then blob = nil end
    local states = gen.decode(blob)
    local out = ONE_OUT
    local o, changed = gen.check(states, cr, cb, out, 0)
    if changed then
      local now_ms = nil
      if keepttl and server then now_ms = now_s * 1000 + (now_n - now_n % 1000000) / 1000000 end
      write_flat(key, plan, states, h[1], now_ms)
    end
    out[o + 1] = nil
    return out
  end

  generic = function(keys, args)
    -- effects replication (TIME before a write): the only way from Redis
    -- 7 on (which says so by its version number), to be asked for before
    if not redis.REDIS_VERSION_NUM and redis.replicate_commands then
      pcall(redis.replicate_commands)
    end
    if not set_clock(args[1]) then return redis.error_reply("paceline: unreadable clock") end
    local slack = num(args[2])
    lease_ns = num(args[3]) * 1000000
    local nplans = num(args[4])
    local plans = {}
    for k = 1, nplans do
      local plan = parse_plan(args[4 + k])
      if plan.fast then
        if plan.gen == nil then
          plan.gen = false
          if plan.n <= 12 then plan.gen = gen_flat(plan) or false end
        end
        if plan.gen then plan.gen.prepare(now_s, now_n) end
      end
      plans[k] = plan
    end
    local base = 4 + nplans
    -- the distinct operations, then one index into them per decision (a
    -- byte, or two, little end first, when there are more than 255)
    local nops = num(args[base + 1])
    local index = args[base + 2]
    local wide = nops > 255
    if not nops or not index or #index ~= #keys * (wide and 2 or 1) then
      return redis.error_reply("paceline: the operations do not match the keys")
    end
    for t = 1, nops do
      local a = base + 2 + (t - 1) * 4
      local plan = plans[num(args[a + 2]) + 1]
      if not plan then return redis.error_reply("paceline: unknown plan") end
      local sr, sb = args[a + 3], args[a + 4]
      local cr, cb = SMALL[sr], SMALL[sb]
      if not cr then cr = tonumber(sr) end
      if not cb then cb = tonumber(sb) end
      O_op[t] = args[a + 1]; O_plan[t] = plan; O_cr[t] = cr; O_cb[t] = cb
    end
    -- each row is read once (one MGET for the whole batch), kept as the
    -- first decision on it found it, and written once at the end if any
    -- decision changed it; rows are numbered in order of first use
    local nkeys = #keys
    local order, row_of, blobs
    local nrows = 0
    if nkeys == 1 then
      -- a lone decision (one caller): no bookkeeping
      order, row_of, nrows = keys, ONE, 1
      blobs = {redis.call("GET", keys[1])}
    else
      local seen = {}
      order, row_of = S_order, S_row_of
      for i = 1, nkeys do
        local key = keys[i]
        local j = seen[key]
        if not j then
          nrows = nrows + 1
          order[nrows] = key
          seen[key] = nrows
          j = nrows
        end
        row_of[i] = j
      end
      blobs = redis.call("MGET", unpack(order, 1, nrows))
    end
    local row_plan, row_states, dirty = S_plan, S_states, S_dirty
    for j = 1, s_rows do row_plan[j] = nil; row_states[j] = nil; dirty[j] = nil end
    s_rows = nrows
    local out = S_out
    local o = 0
    -- the groups, if any: the group being decided (its first decision,
    -- whether one of its checks refused, each touched row as it was, the
    -- rows it changed, where each of its replies starts)
    local joins = args[base + 3 + 4 * nops]
    if joins and #joins ~= nkeys then
      return redis.error_reply("paceline: the groups do not match the keys")
    end
    local g_first, g_refused, g_saved, g_changed, g_at
    for i = 1, nkeys do
      local j = row_of[i]
      local t
      if wide then t = byte(index, 2 * i - 1) + 256 * byte(index, 2 * i) else t = byte(index, i) end
      if t < 1 or t > nops then return redis.error_reply("paceline: unknown operation") end
      local op, cr, cb = O_op[t], O_cr[t], O_cb[t]
      local states = row_states[j]
      local plan
      if states then
        plan = row_plan[j]
      else
        plan = O_plan[t]
        local blob = blobs[j]
        if not blob then blob = nil end
        if plan.gen then states = plan.gen.decode(blob)
        elseif plan.fast then states = flat_decode(blob, plan)
        else states = decode(blob, plan) end
        row_states[j] = states
        row_plan[j] = plan
      end
      local grouped = joins and (byte(joins, i) == 1 or (i < nkeys and byte(joins, i + 1) == 1))
      if grouped then
        if byte(joins, i) ~= 1 or not g_saved then
          g_first, g_refused, g_saved, g_changed, g_at = i, false, {}, {}, {}
        end
        if not g_saved[j] then g_saved[j] = copy_states(plan, states) end
        g_at[i] = o
      end
      local changed
      if op == "c" then
        o, changed = run_check(plan, states, cr, cb, out, o)
        if grouped and out[g_at[i] + 1] % 4 ~= 0 then g_refused = true end
      else
        local st = states
        if plan.fast then st = flat_states(plan, states) end
        if op == "r" then
          changed = release(plan, st, cr)
        else
          local kind, age = string.match(op, "^([fs])(%d+)$")
          if not age then return redis.error_reply("paceline: unknown op " .. tostring(op)) end
          local tolerance = 0
          if args[1] == "T" then tolerance = 100000000 end
          if kind == "f" then
            changed = refund(plan, st, cr, cb, tonumber(age), tolerance)
          else
            changed = settle(plan, st, cr, cb, tonumber(age), tolerance)
          end
        end
        if plan.fast then flat_store(plan, states, st) end
        o = o + 1; out[o] = 0
      end
      if not grouped then
        if changed then dirty[j] = true end
      else
        if changed then g_changed[j] = true end
        if i == nkeys or byte(joins, i + 1) ~= 1 then
          if not g_refused then
            for r in pairs(g_changed) do dirty[r] = true end
          else
            -- refused: every row as it was, and each admitted check's
            -- reply its standing without the group's charge
            for r, saved in pairs(g_saved) do row_states[r] = saved end
            for m = g_first, i do
              local at = g_at[m]
              local u
              if wide then u = byte(index, 2 * m - 1) + 256 * byte(index, 2 * m) else u = byte(index, m) end
              if O_op[u] == "c" and out[at + 1] % 4 == 0 then
                local r = row_of[m]
                run_check(row_plan[r], row_states[r], 0, 0, out, at)
              end
            end
          end
        end
      end
    end
    -- on the server's clock, the instant now in ms (a key's expiry is on
    -- that clock); on the caller's, expiries are not remembered
    local now_ms = nil
    if keepttl and args[1] == "T" then now_ms = now_s * 1000 + (now_n - now_n % 1000000) / 1000000 end
    for j = 1, nrows do
      if dirty[j] then
        local key, plan, states = order[j], row_plan[j], row_states[j]
        if plan.fast then
          write_flat(key, plan, states, slack, now_ms)
        else
          local keep = keep_ms(plan, states)
          if keep <= 0 then
            redis.call("DEL", key)
          else
            redis.call("SET", key, encode(states, plan), "PX", px(keep + slack))
          end
        end
      end
    end
    -- the reply ends at its first nil
    out[o + 1] = nil
    return out
  end
  return generic, one
end

local run_impl, one_impl
local function run(keys, args)
  if not run_impl then run_impl, one_impl = make() end
  return run_impl(keys, args)
end
local function one(keys, args)
  if not one_impl then run_impl, one_impl = make() end
  return one_impl(keys, args)
end
