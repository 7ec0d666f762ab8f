import { render } from "preact";
import { App } from "./App";
import { followMlflowLink } from "./mlflowLinks";
import "./styles.css";

followMlflowLink();
render(<App />, document.getElementById("app") as HTMLElement);
