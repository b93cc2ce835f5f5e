// A peer API for the bulk runner's tests: express with express-rate-limit,
// a fixed window of LIMIT requests per WINDOW_MS, publishing the headers of
// one dialect (draft-6, draft-7, draft-8 or legacy X-RateLimit-*).
// Usage: node express-limiter.js DIALECT [LIMIT] [WINDOW_MS]
// Listens on 127.0.0.1 on a free port and prints "listening PORT"; exits
// when its stdin closes. PEER_LOG=1 logs each answer (time, status, counts)
// to stderr.
const path = require("path");
const modules = path.resolve(process.env.PEERS_NODE_MODULES || path.join(__dirname, "node_modules"));
const express = require(path.join(modules, "express"));
const { rateLimit } = require(path.join(modules, "express-rate-limit"));

const dialect = process.argv[2] || "draft-8";
const limit = Number(process.argv[3] || 8);
const windowMs = Number(process.argv[4] || 2000);
const legacy = dialect === "legacy";
const app = express();
if (process.env.PEER_LOG) {
  app.use((req, res, next) => {
    const t = Date.now();
    res.on("finish", () =>
      console.error(`${t % 100000} ${res.statusCode} ${res.getHeader("ratelimit") || ""} ${res.getHeader("ratelimit-remaining") || ""} ${res.getHeader("ratelimit-reset") || ""}`)
    );
    next();
  });
}
app.use(
  rateLimit({
    windowMs,
    limit,
    identifier: "jobs",
    standardHeaders: legacy ? false : dialect,
    legacyHeaders: legacy,
  })
);
app.get("*splat", (req, res) => res.send("ok"));
if (process.env.PEER_LOG) {
  app.use((req, res) => res.end());
}
const server = app.listen(0, "127.0.0.1", () => {
  console.log(`listening ${server.address().port}`);
});
process.stdin.on("end", () => process.exit(0));
process.stdin.resume();
