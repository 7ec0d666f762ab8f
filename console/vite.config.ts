import { defineConfig } from "vite";

// The bundle is served by the Kiln server itself (kiln.api) at "/", its assets at "/assets/...": it is written
// into the Python package so that a wheel built after `make console` ships it. JSX goes through esbuild with
// Preact's automatic runtime (no Babel, no React compatibility layer).
export default defineConfig({
  base: "/",
  esbuild: { jsx: "automatic", jsxImportSource: "preact" },
  build: {
    outDir: "../src/kiln/api/console_dist",
    emptyOutDir: true,
    target: "es2020",
    sourcemap: false,
    chunkSizeWarningLimit: 300,
  },
  server: {
    // `npm run dev` against a running server: KILN_CONSOLE_API=http://127.0.0.1:8080 npm run dev
    proxy: { "/api": { target: process.env.KILN_CONSOLE_API ?? "http://127.0.0.1:8080", changeOrigin: false } },
  },
});
